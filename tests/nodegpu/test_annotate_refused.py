"""The node annotator under a role that lets it list its node but not watch it, against the fake
API server: the poll it falls back to is said once, not again at every retry of the watch."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from nodegpu.annotate import NodeAnnotator, node_annotations, same_annotations
from nodegpu.inventory import Inventory, NodeGpu
from nodegpu.state import LiveInventory
from tests.harness.fakeapi import FakeApiServer

NODE = "n1"
WAIT_S = 10.0
GPUS = (NodeGpu("GPU-a", 0, "Fake", 16000), NodeGpu("GPU-b", 1, "Fake", 16000))
DENIED = (
    'nodes is forbidden: User "system:serviceaccount:baton-system:baton-deviceplugin" cannot '
    'watch resource "nodes" in API group "" at the cluster scope'
)
REFUSED = 3
"""Watches refused before the role grants it."""


def test_a_role_with_list_but_not_watch_says_the_poll_once_until_the_watch_is_granted(
    fake_api: FakeApiServer, api_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Each retry of the watch lists the node (allowed) and is refused the watch: the list
    switched the poll off ("watching node again") and the refusal on again ("forbidden"), two
    lines every 2 minutes for as long as the role stays so."""
    fake_api.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    fake_api.fail_next("watch", "nodes", 403, times=REFUSED, message=DENIED)
    caplog.set_level(logging.INFO, logger="nodegpu.annotate")
    live = LiveInventory(Inventory(GPUS, 4))
    wanted = node_annotations(live.snapshot()[1], 4096)
    annotator = NodeAnnotator(api_client, NODE, live, 4096, poll_s=3600, watch_retry_s=0.05)
    annotator.start()
    try:
        # The watch after the refused ones is answered: it takes over from the poll.
        fake_api.wait_for_requests("watch", "nodes", REFUSED + 1, timeout=WAIT_S)
        assert annotator.watching.wait(WAIT_S), "the watch did not take over once granted"
        assert not annotator.polling.is_set()
        assert len(fake_api.requests("list", "nodes")) == REFUSED + 1

        def annotated(node: Any) -> bool:
            return node is not None and same_annotations(node["metadata"]["annotations"], wanted)

        fake_api.wait_for_object("Node", NODE, annotated, timeout=WAIT_S)
    finally:
        annotator.stop()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    forbidden = [line for line in said if "forbidden" in line]
    again = [line for line in said if "watching node n1 again" in line]
    assert len(forbidden) == 1, said
    assert DENIED in forbidden[0] and "its role lacks watch on nodes" in forbidden[0]
    assert len(again) == 1, said
