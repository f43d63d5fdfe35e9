"""The reflector through the Kubernetes client, against the fake API server and a silent one."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from baton.contract.kube import Outage
from baton.contract.reflector import Backoff, KubeSource, Reflector, WatchEvent
from tests.harness.fakeapi import FakeApiServer

WAIT_S = 10.0


class Pods:
    """A store of pod names, with a condition to wait on."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.replaced = 0
        self.changed = threading.Condition()

    def replace(self, objects: list[dict[str, Any]], resource_version: str) -> None:
        with self.changed:
            self.names = {o["metadata"]["name"] for o in objects}
            self.replaced += 1
            self.changed.notify_all()

    def apply(self, event: WatchEvent) -> None:
        with self.changed:
            name = event.object["metadata"]["name"]
            (self.names.discard if event.type == "DELETED" else self.names.add)(name)
            self.changed.notify_all()

    def wait(self, names: set[str]) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.names == names, WAIT_S), self.names


def pod(name: str, node: str = "n1") -> dict[str, Any]:
    meta = {"name": name, "namespace": "team"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": node}}


def outage() -> Outage:
    return Outage(logging.getLogger("test.reflector"), "watch of pods", "nothing changes")


@pytest.fixture
def pods() -> Pods:
    return Pods()


@pytest.fixture
def reflector(api_client: Any, pods: Pods) -> Iterator[Reflector]:
    source = KubeSource(api_client, "pods", field_selector="spec.nodeName=n1")
    running = Reflector(source, pods, outage(), name="test-reflector", page=2)
    yield running
    assert running.stop(), "the thread ended"


def test_lists_in_pages_then_follows_the_watch(
    fake_api: FakeApiServer, reflector: Reflector, pods: Pods
) -> None:
    for name in ("a", "b", "c", "d", "e"):
        fake_api.put_object(pod(name))
    fake_api.put_object(pod("elsewhere", node="n2"))
    reflector.start()
    pods.wait({"a", "b", "c", "d", "e"})
    lists = fake_api.requests("list", "pods")
    assert [r.query.get("limit") for r in lists] == ["2", "2", "2"]
    (watch,) = fake_api.wait_for_requests("watch", "pods")
    assert watch.query["allowWatchBookmarks"] == "true"
    assert watch.query["resourceVersion"] == reflector.resource_version
    fake_api.remove_object("Pod", "a", "team")
    fake_api.put_object(pod("f"))
    pods.wait({"b", "c", "d", "e", "f"})
    assert pods.replaced == 1


def test_history_gone_under_the_watch_leads_to_a_relist(
    fake_api: FakeApiServer, reflector: Reflector, pods: Pods
) -> None:
    fake_api.put_object(pod("a"))
    reflector.start()
    pods.wait({"a"})
    fake_api.wait_for_requests("watch", "pods")
    with fake_api.atomically():
        fake_api.remove_object("Pod", "a", "team")
        fake_api.put_object(pod("b"))
        fake_api.compact_history()
    pods.wait({"b"})
    assert pods.replaced == 2


def test_an_outage_is_ridden_out_and_the_watch_resumes(
    fake_api: FakeApiServer, reflector: Reflector, pods: Pods, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "test.reflector")
    fake_api.put_object(pod("a"))
    reflector.start()
    pods.wait({"a"})
    fake_api.wait_for_requests("watch", "pods")
    fake_api.stop()
    fake_api.remove_object("Pod", "a", "team")
    fake_api.put_object(pod("b"))
    fake_api.start()
    pods.wait({"b"})
    assert pods.replaced == 1, "the history was there: the watch resumed, no relist"


def test_stop_cuts_a_request_the_api_server_never_answers() -> None:
    """Mid-request, before any answer: the connection is cut, so stop() does not wait out the
    request's timeout (a thread left reading at interpreter exit can abort the process)."""
    accepted: list[socket.socket] = []
    connected, done = threading.Event(), threading.Event()
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.05)

    def accept() -> None:
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                accepted.append(server.accept()[0])
                connected.set()

    acceptor = threading.Thread(target=accept, name="silent-api")
    acceptor.start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.getsockname()[1]}"
    api = client.ApiClient(configuration)
    source = KubeSource(api, "pods")
    reflector = Reflector(source, Pods(), outage(), name="silent-watch", request_timeout_s=60)
    try:
        reflector.start()
        assert connected.wait(WAIT_S), "the list never connected"
        began = time.monotonic()
        assert reflector.stop(timeout_s=WAIT_S)
        assert time.monotonic() - began < 2.0, "stop() waited for the request's timeout"
    finally:
        done.set()
        acceptor.join(5)
        for conn in accepted:
            conn.close()
        server.close()
        api.close()


def test_stop_ends_a_backoff_at_once(api_client: Any, fake_api: FakeApiServer) -> None:
    fake_api.stop()
    failed = threading.Event()
    source = KubeSource(api_client, "nodes")
    reflector = Reflector(
        source, Pods(), outage(), backoff=Backoff(30.0, 30.0), on_restart=lambda why: failed.set()
    )
    reflector.start()
    assert failed.wait(WAIT_S), "the list never failed"
    began = time.monotonic()
    assert reflector.stop()
    assert time.monotonic() - began < 2.0
