"""Serving the verbs over HTTPS with a certificate made for the test."""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import httpx
import pytest

from extender.app import create_app
from extender.cache import ClusterCache
from extender.http import CLIENT_CERT_NEEDED
from extender.main import ExtenderStartError, check_tls
from extender.metrics import Metrics
from extender.placement import Limits
from extender.server import ServerThread
from extender.state import ClusterState
from tests.extender.builders import node, pod
from tests.tlscerts import Authority

SERVICE = "baton-extender.baton-system.svc"


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for the extender's Service name and 127.0.0.1 and its key, issued by the
    CA whose certificate is `directory / "serving-CA.crt"` (`trusting`)."""
    return Authority(directory, "serving CA").issue(SERVICE, (SERVICE, "127.0.0.1"))


def trusting(directory: Path) -> ssl.SSLContext:
    """A client context trusting `self_signed`'s CA."""
    return ssl.create_default_context(cafile=str(directory / "serving-CA.crt"))


def test_verbs_over_https_with_a_verified_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    cache = ClusterCache.filled(ClusterState(Limits(), time.monotonic), [node("n1")], [])
    trust = trusting(tmp_path)
    with ServerThread(
        create_app(cache, None, Metrics()), certfile=str(cert), keyfile=str(key)
    ) as s:
        body = {"Pod": pod(), "Nodes": None, "NodeNames": ["n1"]}
        answer = httpx.post(
            f"https://127.0.0.1:{s.port}/filter", json=body, verify=trust, timeout=10
        )
        assert answer.status_code == 200
        assert answer.json()["NodeNames"] == ["n1"]
        # Without --tls-client-ca no route asks for a client certificate, /bind neither.
        bind = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n1"}
        bound = httpx.post(f"https://127.0.0.1:{s.port}/bind", json=bind, verify=trust, timeout=10)
        assert bound.status_code == 200
        assert "without an API server" in bound.json()["Error"]
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"https://127.0.0.1:{s.port}/healthz", timeout=10)
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.get(f"http://127.0.0.1:{s.port}/healthz", timeout=10)


def test_bind_needs_a_client_certificate_of_the_client_ca(tmp_path: Path) -> None:
    ca = Authority(tmp_path, "serving CA")
    cert, key = ca.issue(SERVICE, (SERVICE, "127.0.0.1"))
    clients = Authority(tmp_path, "scheduler CA")
    scheduler = clients.issue("baton-scheduler", client=True)
    stranger = Authority(tmp_path, "other CA").issue("baton-scheduler", client=True)
    cache = ClusterCache.filled(ClusterState(Limits(), time.monotonic), [node("n1")], [])
    with ServerThread(
        create_app(cache, None, Metrics()),
        certfile=str(cert),
        keyfile=str(key),
        client_ca=str(clients.cert),
    ) as s:
        url = f"https://127.0.0.1:{s.port}"
        bind = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n1"}

        def trust(client: tuple[Path, Path] | None = None) -> ssl.SSLContext:
            context = ssl.create_default_context(cafile=str(ca.cert))
            if client is not None:
                context.load_cert_chain(*map(str, client))
            return context

        # Without a certificate: the reading verbs are served, /bind is refused naming why.
        body = {"Pod": pod(), "Nodes": None, "NodeNames": ["n1"]}
        answer = httpx.post(f"{url}/filter", json=body, verify=trust(), timeout=10)
        assert answer.status_code == 200, answer.text
        refused = httpx.post(f"{url}/bind", json=bind, verify=trust(), timeout=10)
        assert refused.status_code == 403
        assert refused.text.strip() == f"/bind {CLIENT_CERT_NEEDED}"
        # kube-scheduler's certificate reaches the binder (here one without an API server).
        bound = httpx.post(f"{url}/bind", json=bind, verify=trust(scheduler), timeout=10)
        assert bound.status_code == 200
        assert "without an API server" in bound.json()["Error"]
        # A certificate another CA signed ends the handshake.
        with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
            httpx.post(f"{url}/bind", json=bind, verify=trust(stranger), timeout=10)


def test_a_client_ca_that_is_missing_or_not_pem_stops_the_start_in_one_line(
    tmp_path: Path,
) -> None:
    cert, key = self_signed(tmp_path)
    (tmp_path / "not-pem").write_text("not a certificate\n")
    with pytest.raises(ExtenderStartError, match=r"^--tls-client-ca \S+/none: cannot read it"):
        check_tls(str(cert), str(key), str(tmp_path / "none"))
    with pytest.raises(ExtenderStartError, match=r"does not load as PEM CA certificates"):
        check_tls(str(cert), str(key), str(tmp_path / "not-pem"))
