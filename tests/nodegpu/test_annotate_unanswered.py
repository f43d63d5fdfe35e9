"""The node annotator stopped while the API server accepts its node read but does not answer:
the stop ends its thread within that read's one timeout (the node layer's part of a pod's
grace period), not after four."""

from __future__ import annotations

import threading
from typing import Any

from nodegpu.annotate import NodeAnnotator
from nodegpu.inventory import Inventory, NodeGpu
from nodegpu.state import LiveInventory
from tests.harness.fakeapi import FakeApiServer

NODE = "n1"
GPUS = (NodeGpu("GPU-a", 0, "Fake", 16000),)


def test_a_stop_while_the_node_read_is_not_answered_ends_the_annotator(
    fake_api: FakeApiServer, api_client: Any
) -> None:
    """The client's default retried the timed-out read three times (20 s): the stop gave up
    waiting after 15 s and left the thread in the API call."""
    fake_api.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    fake_api.hang_next("get", "nodes", times=4)
    annotator = NodeAnnotator(api_client, NODE, LiveInventory(Inventory(GPUS, 4)), 4096)
    annotator.start()
    try:
        fake_api.wait_for_requests("get", "nodes", timeout=10)
    finally:
        annotator.stop()
        fake_api.release_hangs()
    left = [t.name for t in threading.enumerate() if t.name == "node-annotator"]
    assert left == [], "the annotator's thread is still in an API call after its stop"
    assert len(fake_api.requests("get", "nodes")) == 1, "the node read was retried"
