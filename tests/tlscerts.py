"""Certificates made for a test: a CA and the server and client certificates it signs."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


class Authority:
    """A CA whose certificate and issued pairs are PEM files in `directory`."""

    def __init__(self, directory: Path, name: str = "test CA"):
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (
            self._builder(self._name, self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self._stem = name.replace(" ", "-")
        self.cert = directory / f"{self._stem}.crt"
        self.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self, common_name: str, hosts: tuple[str, ...] = (), client: bool = False
    ) -> tuple[Path, Path]:
        """A certificate for `hosts` (DNS names or IP addresses) or, with `client`, for TLS
        client authentication; its file and its key's."""
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = self._builder(name, key.public_key()).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False
        )
        if hosts:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_general_name(host) for host in hosts]),
                critical=False,
            )
        cert = builder.sign(self._key, hashes.SHA256())
        stem = self.directory / f"{self._stem}.{common_name.replace(' ', '-')}"
        cert_path, key_path = Path(f"{stem}.crt"), Path(f"{stem}.key")
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return cert_path, key_path

    def _builder(self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey) -> Any:
        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
        )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)
