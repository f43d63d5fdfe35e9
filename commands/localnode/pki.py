"""The node's certificates: a CA, the API server's serving certificate, client certificates."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from commands.localnode.procs import run

SERVICE_IP = "10.96.0.1"
"""The first address of the service range: the `kubernetes` Service's ClusterIP."""


@dataclass(frozen=True)
class Pki:
    """Paths of everything `make_pki` wrote."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def sa_key(self) -> Path:
        return self.root / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.root / "sa.pub"

    def cert(self, name: str) -> Path:
        return self.root / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.root / f"{name}.key"


def _openssl(*args: str, stdin: str | None = None) -> None:
    run(["openssl", *args], input=stdin)


def _ec_key(path: Path) -> None:
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(path))


def _issue(pki: Pki, name: str, subject: str, extensions: str) -> None:
    """A certificate for `name` signed by the CA, with the given v3 extensions."""
    _ec_key(pki.key(name))
    csr = pki.root / f"{name}.csr"
    ext = pki.root / f"{name}.ext"
    ext.write_text(extensions)
    _openssl("req", "-new", "-key", str(pki.key(name)), "-subj", subject, "-out", str(csr))
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(pki.ca_cert), "-CAkey", str(pki.ca_key),
        "-CAcreateserial", "-days", "30", "-sha256", "-extfile", str(ext), "-out",
        str(pki.cert(name)),
    )  # fmt: skip
    csr.unlink()
    ext.unlink()


CLIENTS = {
    "admin": "/O=system:masters/CN=baton-localnode-admin",
    "kube-controller-manager": "/CN=system:kube-controller-manager",
    "kube-scheduler": "/CN=system:kube-scheduler",
    "apiserver-kubelet-client": "/O=system:masters/CN=kube-apiserver-kubelet-client",
}


def make_pki(root: Path, node_name: str) -> Pki:
    """A fresh CA and every certificate the node needs, under `root`."""
    root.mkdir(parents=True, exist_ok=True)
    pki = Pki(root)
    _ec_key(pki.ca_key)
    _openssl(
        "req", "-x509", "-new", "-key", str(pki.ca_key), "-subj", "/CN=baton-localnode-ca",
        "-days", "30", "-sha256", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", str(pki.ca_cert),
    )  # fmt: skip
    sans = f"DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:{node_name},IP:127.0.0.1,IP:{SERVICE_IP}"  # noqa: E501
    server_ext = "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    _issue(pki, "apiserver", "/CN=kube-apiserver", f"{server_ext}subjectAltName={sans}\n")
    _issue(
        pki,
        "kubelet-serving",
        f"/O=system:nodes/CN=system:node:{node_name}",
        f"{server_ext}subjectAltName=DNS:{node_name},DNS:localhost,IP:127.0.0.1\n",
    )
    client_ext = "keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"
    for name, subject in {
        **CLIENTS,
        "kubelet": f"/O=system:nodes/CN=system:node:{node_name}",
    }.items():
        _issue(pki, name, subject, client_ext)
    run(["openssl", "genrsa", "-out", str(pki.sa_key), "2048"])
    _openssl("rsa", "-in", str(pki.sa_key), "-pubout", "-out", str(pki.sa_pub))
    return pki


def kubeconfig(pki: Pki, name: str, server: str, path: Path) -> Path:
    """A kubeconfig for client certificate `name` against `server`, verified by the CA."""
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
  - name: local
    cluster:
      server: {server}
      certificate-authority: {pki.ca_cert}
users:
  - name: {name}
    user:
      client-certificate: {pki.cert(name)}
      client-key: {pki.key(name)}
contexts:
  - name: local
    context: {{cluster: local, user: {name}}}
current-context: local
"""
    )
    return path
