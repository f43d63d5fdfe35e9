"""The node layer: one object starts and stops the node's parts; publications retry until they
get there; both node commands take the same node options."""

from __future__ import annotations

import inspect
import json
import logging
import socket
import threading
import urllib.request
from dataclasses import replace
from typing import Any

import pytest

from baton.contract.kube import Outage
from commands.cli import deviceplugin, dra
from commands.cli.options import NodeOptions, node_options
from nodegpu.gpus import parse_fake_gpus
from nodegpu.node import NodeGpus, NodeSettings, NodeStartError, node_fields
from nodegpu.republish import Republisher
from tests.harness.agent import http_get

WAIT_S = 10.0


def _settings(port: int = 0) -> NodeSettings:
    return NodeSettings(node_name="n1", metrics_host="127.0.0.1", metrics_port=port)


def _get(node: NodeGpus, path: str) -> tuple[int, str]:
    return http_get(f"http://127.0.0.1:{node.status.port}{path}", timeout=5)


def test_one_object_serves_status_and_fake_faults_and_stops() -> None:
    why: list[str | None] = ["not registered"]
    node = NodeGpus(_settings(), parse_fake_gpus("2x81920", "n1"), True, None, lambda: why[0])
    node.start()
    try:
        assert _get(node, "/readyz")[0] == 503
        why[0] = None
        assert _get(node, "/readyz")[0] == 200
        request = urllib.request.Request(
            f"http://127.0.0.1:{node.status.port}/fake/xid",
            data=json.dumps({"gpu": "0", "xid": 79}).encode(),
        )
        urllib.request.urlopen(request, timeout=5).close()
        assert len(node.inventory.snapshot()[1].unhealthy) == 1
        assert "unhealthy_gpus 1.0" in _get(node, "/metrics")[1]
    finally:
        node.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", node.status.port), timeout=1).close()


def test_a_taken_metrics_port_is_one_sentence() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(NodeStartError, match="pass another --metrics-port"):
            NodeGpus(_settings(taken.getsockname()[1]), [], True, None, lambda: None)


@pytest.mark.parametrize("host", ["no-such-host.invalid", "192.0.2.1"])
def test_a_metrics_host_this_machine_cannot_serve_on_is_named_as_the_problem(host) -> None:
    settings = replace(_settings(0), metrics_host=host)
    with pytest.raises(NodeStartError, match=f"on {host}:0 .*pass a --metrics-host of this"):
        NodeGpus(settings, [], True, None, lambda: None)


def test_a_daemons_settings_start_from_the_node_settings() -> None:
    from deviceplugin.daemon import Settings

    node = _settings(1234)
    settings = Settings(**node_fields(node), cdi=True)
    assert node_fields(settings) == node_fields(node) and settings.cdi


@pytest.mark.parametrize("command", [deviceplugin.deviceplugin, dra.dra])
def test_both_node_commands_take_every_node_option(command: Any) -> None:
    parameters = inspect.signature(command).parameters
    arguments = {name: p.default for name, p in parameters.items()}
    assert isinstance(node_options(arguments), NodeOptions)


def test_a_failed_publication_is_retried_until_it_succeeds(caplog: Any) -> None:
    attempts: list[int] = []

    def publish() -> None:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("refused")

    log = logging.getLogger("tests.republish")
    republisher = Republisher("t", publish, Outage(log, "publishing t", "nothing"), 0.01)
    republisher.start()
    try:
        assert republisher.published.wait(WAIT_S)
        assert len(attempts) == 3
        republisher.poke()
        assert republisher.published.wait(WAIT_S) and len(attempts) == 4
    finally:
        republisher.stop()


def test_stop_ends_a_wait_between_retries_at_once() -> None:
    failing = threading.Event()

    def publish() -> None:
        failing.set()
        raise ConnectionError("refused")

    republisher = Republisher(
        "t", publish, Outage(logging.getLogger("t"), "t", "t"), first_backoff_s=300.0
    )
    republisher.start()
    assert failing.wait(WAIT_S)
    republisher.stop()
    assert not republisher._thread.is_alive()


def test_a_resync_publishes_again_without_a_poke_and_only_with_one_asked() -> None:
    """An object someone else deletes (the kubelet deletes a driver's ResourceSlices when it
    restarts) comes back within `resync_s`; without `resync_s` nothing publishes unpoked."""
    calls = {"resync": threading.Semaphore(0), "plain": threading.Semaphore(0)}
    outage = Outage(logging.getLogger("t"), "t", "t")
    resyncing = Republisher("r", calls["resync"].release, outage, 0.01, resync_s=0.05)
    plain = Republisher("p", calls["plain"].release, outage, 0.01)
    resyncing.start()
    plain.start()
    try:
        assert calls["plain"].acquire(timeout=WAIT_S)  # the first publication
        for _ in range(3):  # the first, then two with nothing poked
            assert calls["resync"].acquire(timeout=WAIT_S)
        assert not calls["plain"].acquire(timeout=0.3)
    finally:
        resyncing.stop()
        plain.stop()
