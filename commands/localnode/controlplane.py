"""etcd, kube-apiserver, kube-controller-manager and kube-scheduler on loopback, no kubelet."""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import socket
import ssl
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from commands.localnode.binaries import KubeBinaries, require_binaries
from commands.localnode.pki import Pki, kubeconfig, make_pki
from commands.localnode.procs import LocalNodeError, Process, wait_for

ETCD_PORT = 12379
ETCD_PEER_PORT = 12380
APISERVER_PORT = 16443
"""Fixed so manifests for this node can name it (manifests/overlays/local)."""
SERVICE_RANGE = "10.96.0.0/24"
START_TIMEOUT = 60.0


LISTEN_FLOOR = 20000
"""The lowest port `free_ports` draws."""
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
EPHEMERAL_DEFAULT = (32768, 60999)
"""Linux's ephemeral range, where `EPHEMERAL_RANGE` cannot be read."""


def free_ports(count: int) -> tuple[int, ...]:
    """`count` loopback TCP ports nobody listens on now, for daemons to listen on.

    They are drawn outside the kernel's ephemeral range (below it, else above it), from which
    every outgoing connection takes its local port: a port the kernel hands out for listening
    (bind to port 0) is one of those, and a connection made before the daemon binds it could
    take it first. A host whose ephemeral range leaves no room either side gets those.
    """
    first, last = EPHEMERAL_DEFAULT
    with contextlib.suppress(OSError, ValueError):
        first, last = map(int, Path(EPHEMERAL_RANGE).read_text().split()[:2])
    spans = [(LISTEN_FLOOR, first), (last + 1, 65536)]
    span = max(spans, key=lambda s: s[1] - s[0])
    if span[1] - span[0] < 64 * count:
        return _kernel_ports(count)
    found: list[int] = []
    for port in random.sample(range(*span), 64 * count):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        found.append(port)
        if len(found) == count:
            return tuple(found)
    raise LocalNodeError(
        f"found {len(found)} of {count} free loopback ports in {span[0]}-{span[1] - 1}"
    )


def _kernel_ports(count: int) -> tuple[int, ...]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return tuple(int(sock.getsockname()[1]) for sock in socks)
    finally:
        for sock in socks:
            sock.close()


class ControlPlane:
    """A control plane for one node; `start()` it, `close()` stops every process it started."""

    def __init__(
        self,
        root: Path | None = None,
        binaries: KubeBinaries | None = None,
        node_name: str = "localhost",
        controller_manager: bool = True,
        scheduler: bool = True,
        ports: str = "fixed",
    ) -> None:
        """`ports="free"` picks unused loopback ports, so a second one can run beside."""
        self.root = root or Path(tempfile.mkdtemp(prefix="baton-localnode-"))
        self._own_root = root is None
        self.binaries = binaries or require_binaries()
        self.node_name = node_name
        self.with_controller_manager = controller_manager
        self.with_scheduler = scheduler
        fixed = (ETCD_PORT, ETCD_PEER_PORT, APISERVER_PORT)
        self.etcd_port, self.etcd_peer_port, self.apiserver_port = (
            fixed if ports == "fixed" else free_ports(3)
        )
        self.server = f"https://127.0.0.1:{self.apiserver_port}"
        self.logs = self.root / "logs"
        self.pki: Pki | None = None
        self.processes: dict[str, Process] = {}

    @property
    def admin_kubeconfig(self) -> Path:
        """A kubeconfig with cluster-admin rights (system:masters)."""
        return self.root / "admin.kubeconfig"

    def _kubeconfig(self, name: str) -> Path:
        assert self.pki is not None
        return kubeconfig(self.pki, name, self.server, self.root / f"{name}.kubeconfig")

    def start(self) -> ControlPlane:
        """Bring up etcd, the API server and (unless left out) the controllers and scheduler."""
        try:
            self.pki = make_pki(self.root / "pki", self.node_name)
            for name in ("admin", "kube-controller-manager", "kube-scheduler"):
                self._kubeconfig(name)
            self._start_etcd()
            self.start_apiserver()
            if self.with_controller_manager:
                self._start_controller_manager()
            if self.with_scheduler:
                self._start_scheduler()
        except BaseException:
            self.close()
            raise
        return self

    def _spawn(self, name: str, argv: list[str]) -> Process:
        proc = Process(name, argv, self.logs / f"{name}.log").start()
        self.processes[name] = proc
        return proc

    def _start_etcd(self) -> None:
        proc = self._spawn(
            "etcd",
            [
                str(self.binaries.etcd),
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
            ],
        )

        def ready() -> bool | None:
            proc.check()
            return True if "etcd ready" in proc.tail(50) else None

        wait_for("etcd to serve", ready, START_TIMEOUT)

    def start_apiserver(self) -> None:
        """Start (or start again) kube-apiserver and wait until /readyz answers ok."""
        pki = self.pki
        assert pki is not None
        self._spawn(
            "kube-apiserver",
            [
                str(self.binaries.kube_apiserver),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                f"--service-cluster-ip-range={SERVICE_RANGE}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction,ServiceAccount",
                "--allow-privileged=true",
                f"--client-ca-file={pki.ca_cert}",
                f"--tls-cert-file={pki.cert('apiserver')}",
                f"--tls-private-key-file={pki.key('apiserver')}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--kubelet-client-certificate={pki.cert('apiserver-kubelet-client')}",
                f"--kubelet-client-key={pki.key('apiserver-kubelet-client')}",
                f"--kubelet-certificate-authority={pki.ca_cert}",
                "--kubelet-preferred-address-types=Hostname,InternalIP",
                f"--cert-dir={self.root / 'apiserver-certs'}",
                "--profiling=false",
            ],
        )
        wait_for("kube-apiserver /readyz", self._ready, START_TIMEOUT, every=0.2)

    def _ready(self) -> bool | None:
        self.processes["kube-apiserver"].check()
        try:
            self.get("/readyz")
        except (OSError, LocalNodeError):
            return None
        return True

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver (for restart tests); `start_apiserver` brings it back."""
        proc = self.processes.pop("kube-apiserver", None)
        if proc:
            proc.stop()

    def get(self, path: str) -> object:
        """GET `path` from the API server as the admin; the decoded JSON (or text)."""
        pki = self.pki
        assert pki is not None
        context = ssl.create_default_context(cafile=str(pki.ca_cert))
        context.load_cert_chain(str(pki.cert("admin")), str(pki.key("admin")))
        try:
            with urllib.request.urlopen(self.server + path, context=context, timeout=5) as reply:
                body = reply.read().decode()
        except urllib.error.HTTPError as err:
            raise LocalNodeError(f"GET {path}: {err.code} {err.read().decode()[:200]}") from err
        try:
            return json.loads(body)
        except json.JSONDecodeError:
            return body

    def _start_controller_manager(self) -> None:
        pki = self.pki
        assert pki is not None
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.kube_controller_manager),
                f"--kubeconfig={self.root / 'kube-controller-manager.kubeconfig'}",
                f"--root-ca-file={pki.ca_cert}",
                f"--service-account-private-key-file={pki.sa_key}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller",
                "--secure-port=0",
                "--node-monitor-grace-period=20s",
            ],
        )

    def _start_scheduler(self) -> None:
        config = self.root / "kube-scheduler.yaml"
        config.write_text(
            "apiVersion: kubescheduler.config.k8s.io/v1\n"
            "kind: KubeSchedulerConfiguration\n"
            f"clientConnection: {{kubeconfig: {self.root / 'kube-scheduler.kubeconfig'}}}\n"
            "leaderElection: {leaderElect: false}\n"
        )
        self._spawn(
            "kube-scheduler",
            [str(self.binaries.kube_scheduler), f"--config={config}", "--secure-port=0"],
        )

    def check(self) -> None:
        """LocalNodeError if any of its processes has exited."""
        for proc in self.processes.values():
            proc.check()

    def close(self) -> None:
        """Stop every process, newest first, and remove the run directory if it made it."""
        for name in reversed(list(self.processes)):
            self.processes.pop(name).stop()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
