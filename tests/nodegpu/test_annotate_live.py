"""The node annotations as a real kube-apiserver keeps them (etcd and kube-apiserver only): they
come back after the node is registered again or someone removes or overwrites them, and an
unchanged node is not written again."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from baton.contract.names import ANNOTATION_GPUS, ANNOTATION_HOST_MEMORY_BUDGET
from nodegpu.annotate import NodeAnnotator, annotate_once, node_annotations, same_annotations
from nodegpu.inventory import Inventory, NodeGpu
from nodegpu.state import LiveInventory
from tests.apiserver import api_server

NODE = "n1"
WAIT_S = 10
GPUS = (NodeGpu("GPU-a", 0, "Fake", 16000), NodeGpu("GPU-b", 1, "Fake", 16000))


@pytest.fixture(scope="module")
def api_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from baton.contract.kube import load_api_client

    with api_server(tmp_path_factory, "annotate-plane") as plane:
        yield load_api_client(str(plane.admin_kubeconfig))


@pytest.fixture
def core(api_client: Any) -> Iterator[Any]:
    """The core API with node `NODE` registered (without annotations); deleted after."""
    from kubernetes import client

    api: Any = client.CoreV1Api(api_client)
    api.create_node({"metadata": {"name": NODE}})
    yield api
    api.delete_node(NODE)


def wait_annotated(core: Any, wanted: Mapping[str, str]) -> bool:
    """Whether node `NODE` carries `wanted` within `WAIT_S` (watched, not polled)."""
    from kubernetes import watch

    selector = f"metadata.name={NODE}"
    nodes = core.list_node(field_selector=selector)
    if any(same_annotations(n.metadata.annotations or {}, wanted) for n in nodes.items):
        return True
    stream = watch.Watch()
    for event in stream.stream(
        core.list_node,
        field_selector=selector,
        resource_version=nodes.metadata.resource_version,
        timeout_seconds=WAIT_S,
        _request_timeout=WAIT_S + 5,
    ):
        node = event["object"]
        if event["type"] != "DELETED" and same_annotations(node.metadata.annotations or {}, wanted):
            stream.stop()
            return True
    return False


def test_annotations_come_back_after_the_node_registers_again_or_loses_them(
    api_client: Any, core: Any
) -> None:
    live = LiveInventory(Inventory(GPUS, 4))
    wanted = node_annotations(live.snapshot()[1], 4096)
    annotator = NodeAnnotator(api_client, NODE, live, 4096, resync_s=0.2)
    annotator.start()
    try:
        assert wait_annotated(core, wanted)
        # The node is deleted and its kubelet registers it again: no annotations.
        core.delete_node(NODE)
        core.create_node({"metadata": {"name": NODE}})
        assert wait_annotated(core, wanted)
        # Another controller overwrites one and an operator removes the other.
        patch = {ANNOTATION_GPUS: "[]", ANNOTATION_HOST_MEMORY_BUDGET: None}
        core.patch_node(NODE, {"metadata": {"annotations": patch}})
        assert wait_annotated(core, wanted)
    finally:
        annotator.stop()


def test_annotations_the_node_carries_are_not_written_again(core: Any) -> None:
    wanted = node_annotations(Inventory(GPUS, 4), 4096)
    assert annotate_once(core, NODE, wanted) == "written"
    before = core.read_node(NODE).metadata.resource_version
    # The periodic check: nothing changed, so nothing is written.
    assert annotate_once(core, NODE, wanted) == "unchanged"
    # The same inventory written out differently by someone else is the same inventory.
    spaced = {ANNOTATION_GPUS: json.dumps(json.loads(wanted[ANNOTATION_GPUS]), indent=1)}
    core.patch_node(NODE, {"metadata": {"annotations": spaced}})
    respaced = core.read_node(NODE).metadata.resource_version
    assert respaced != before
    assert annotate_once(core, NODE, wanted) == "unchanged"
    assert core.read_node(NODE).metadata.resource_version == respaced
    # An unreadable one is written over.
    core.patch_node(NODE, {"metadata": {"annotations": {ANNOTATION_HOST_MEMORY_BUDGET: "lots"}}})
    assert annotate_once(core, NODE, wanted) == "written"
    assert core.read_node(NODE).metadata.annotations[ANNOTATION_HOST_MEMORY_BUDGET] == "4096"
