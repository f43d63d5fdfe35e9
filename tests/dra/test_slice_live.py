"""The ResourceSlice as a real kube-apiserver keeps it (etcd and kube-apiserver only: no
garbage collector, so a test deletes what it would)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from baton.contract.draapi import DraApi
from dra.daemon import Driver
from dra.publisher import publish_once
from dra.slices import slice_name
from nodegpu.inventory import Inventory, NodeGpu
from nodegpu.state import LiveInventory
from tests.apiserver import api_server
from tests.dra.test_driver import GPUS, WAIT_S, _settings

NODE = "n1"


@pytest.fixture(scope="module")
def api_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from baton.contract.kube import load_api_client

    with api_server(tmp_path_factory, "dra-plane") as plane:
        yield load_api_client(str(plane.admin_kubeconfig))


def register_node(api_client: Any) -> str:
    """Create node `NODE` as a kubelet registers it (with its runtime); its UID."""
    from kubernetes import client

    core: Any = client.CoreV1Api(api_client)
    node = core.create_node({"metadata": {"name": NODE}})
    status = {"status": {"nodeInfo": {"containerRuntimeVersion": "containerd://2.3.4"}}}
    core.patch_node_status(NODE, status)
    return str(node.metadata.uid)


def owner_uid(api: DraApi) -> str:
    (found,) = [s for s in api.list_slices() if s["metadata"]["name"] == slice_name(NODE)]
    return str(found["metadata"]["ownerReferences"][0]["uid"])


def test_a_node_registered_again_owns_the_slice_published_after(
    api_client: Any, tmp_path: Path
) -> None:
    from kubernetes import client

    first = register_node(api_client)
    api = DraApi(api_client, NODE)
    driver = Driver(_settings(tmp_path), GPUS, True, api=api)
    driver.start()
    try:
        assert driver.publisher.published.wait(WAIT_S)
        assert owner_uid(api) == first
        # The node is deleted and its kubelet registers it again under the same name; the
        # garbage collector deletes the slice the old node owned.
        client.CoreV1Api(api_client).delete_node(NODE)
        second = register_node(api_client)
        api.delete_slice(slice_name(NODE))
        driver.publisher.poke()
        assert driver.publisher.published.wait(WAIT_S)
        # Owned by the old UID, the garbage collector would delete it again at once.
        assert owner_uid(api) == second
    finally:
        driver.stop()
        client.CoreV1Api(api_client).delete_node(NODE)
        api.delete_slice(slice_name(NODE))  # as the garbage collector would


def test_a_slice_written_back_in_canonical_quantities_is_unchanged(api_client: Any) -> None:
    # 16000 MiB is 16777216000 bytes: the API server keeps it as "16777216k".
    gpus = (NodeGpu("GPU-a", 0, "Fake", 16000),)
    api, live = DraApi(api_client, NODE), LiveInventory(Inventory(gpus, 4))
    assert publish_once(api, NODE, live, lambda: "") == "created"
    try:
        # The resync every 10 s: nothing changed, so nothing is written (no new generation).
        assert publish_once(api, NODE, live, lambda: "") == "unchanged"
    finally:
        api.delete_slice(slice_name(NODE))
