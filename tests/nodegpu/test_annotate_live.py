"""The node annotations as a real kube-apiserver keeps them (etcd and kube-apiserver only): they
come back after the node is registered again or someone removes or overwrites them (seen by a
watch of the node, or polled where the role refuses the watch), and an unchanged node is not
written again."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from baton.contract.names import ANNOTATION_GPUS, ANNOTATION_HOST_MEMORY_BUDGET
from nodegpu.annotate import NodeAnnotator, annotate_once, node_annotations, same_annotations
from nodegpu.inventory import Inventory, NodeGpu
from nodegpu.state import LiveInventory
from tests.apiserver import api_server

NODE = "n1"
WAIT_S = 10
BACK_S = 5
"""Annotations the watch saw removed are back within this: well under the poll's 10 s."""
GPUS = (NodeGpu("GPU-a", 0, "Fake", 16000), NodeGpu("GPU-b", 1, "Fake", 16000))


@pytest.fixture(scope="module")
def admin_kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with api_server(tmp_path_factory, "annotate-plane") as plane:
        yield plane.admin_kubeconfig


@pytest.fixture(scope="module")
def api_client(admin_kubeconfig: Path) -> Any:
    from baton.contract.kube import load_api_client

    return load_api_client(str(admin_kubeconfig))


@pytest.fixture
def core(api_client: Any) -> Iterator[Any]:
    """The core API with node `NODE` registered (without annotations); deleted after."""
    from kubernetes import client

    api: Any = client.CoreV1Api(api_client)
    api.create_node({"metadata": {"name": NODE}})
    yield api
    api.delete_node(NODE)


def wait_annotated(core: Any, wanted: Mapping[str, str], wait_s: int = WAIT_S) -> bool:
    """Whether node `NODE` carries `wanted` within `wait_s` (watched, not polled)."""
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
        timeout_seconds=wait_s,
        _request_timeout=wait_s + 5,
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
    # No poll within the test: only the watch of the node can put them back.
    annotator = NodeAnnotator(api_client, NODE, live, 4096, poll_s=3600)
    annotator.start()
    try:
        assert wait_annotated(core, wanted)
        # The node is deleted and its kubelet registers it again: no annotations.
        core.delete_node(NODE)
        core.create_node({"metadata": {"name": NODE}})
        assert wait_annotated(core, wanted, BACK_S)
        # Another controller overwrites one and an operator removes the other.
        patch = {ANNOTATION_GPUS: "[]", ANNOTATION_HOST_MEMORY_BUDGET: None}
        core.patch_node(NODE, {"metadata": {"annotations": patch}})
        assert wait_annotated(core, wanted, BACK_S)
        # Replaced by a node that already carries them: checked, and nothing is written.
        core.delete_node(NODE)
        core.create_node({"metadata": {"name": NODE, "annotations": wanted}})
        assert wait_annotated(core, wanted, BACK_S)
        assert not annotator.polling.is_set()
    finally:
        annotator.stop()


OLD_ROLE = "baton-annotator-old-role"


def old_role_client(api_client: Any, admin: Path, tmp_path: Path, name: str = OLD_ROLE) -> Any:
    """A client whose ServiceAccount `name` may only get and patch nodes (a ClusterRole from
    before the watch, also named `name`): the admin's kubeconfig with that account's token as its
    only credential."""
    from kubernetes import client

    from baton.contract.kube import load_api_client

    core: Any = client.CoreV1Api(api_client)
    rbac: Any = client.RbacAuthorizationV1Api(api_client)
    meta = {"name": name}
    rule = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}
    subject = {"kind": "ServiceAccount", "name": name, "namespace": "default"}
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}
    core.create_namespaced_service_account("default", {"metadata": meta})
    rbac.create_cluster_role({"metadata": meta, "rules": [rule]})
    rbac.create_cluster_role_binding({"metadata": meta, "roleRef": role_ref, "subjects": [subject]})
    request = {"spec": {"expirationSeconds": 3600}}
    token = core.create_namespaced_service_account_token(name, "default", request)
    config: dict[str, Any] = yaml.safe_load(admin.read_text())
    user = {"token": token.status.token}
    config["users"] = [{"name": config["users"][0]["name"], "user": user}]
    path = tmp_path / f"{name}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return load_api_client(str(path))


def test_under_a_role_without_watch_the_annotations_are_polled(
    api_client: Any,
    admin_kubeconfig: Path,
    core: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    live = LiveInventory(Inventory(GPUS, 4))
    wanted = node_annotations(live.snapshot()[1], 4096)
    caplog.set_level(logging.WARNING, logger="nodegpu.annotate")
    old_role = old_role_client(api_client, admin_kubeconfig, tmp_path)
    annotator = NodeAnnotator(old_role, NODE, live, 4096, poll_s=0.2)
    annotator.start()
    try:
        assert wait_annotated(core, wanted)
        assert annotator.polling.wait(WAIT_S), "the refused watch did not fall back to the poll"
        core.patch_node(NODE, {"metadata": {"annotations": {ANNOTATION_GPUS: None}}})
        assert wait_annotated(core, wanted)
        core.delete_node(NODE)
        core.create_node({"metadata": {"name": NODE}})
        assert wait_annotated(core, wanted)
    finally:
        annotator.stop()
    said = [r.getMessage() for r in caplog.records if "forbidden" in r.getMessage()]
    assert len(said) == 1, said
    assert "lacks list and watch on nodes" in said[0]


def test_a_watch_granted_after_start_takes_over_from_the_poll(
    api_client: Any,
    admin_kubeconfig: Path,
    core: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """At install the binding that grants the watch may land after the daemon starts (a GitOps
    sync): the refused watch is tried again, said once, and takes over once granted."""
    from kubernetes import client

    live = LiveInventory(Inventory(GPUS, 4))
    wanted = node_annotations(live.snapshot()[1], 4096)
    caplog.set_level(logging.WARNING, logger="nodegpu.annotate")
    role = "baton-annotator-late-role"
    late = old_role_client(api_client, admin_kubeconfig, tmp_path, role)
    # No poll within the test: once granted, only the watch can put them back.
    annotator = NodeAnnotator(late, NODE, live, 4096, poll_s=3600, watch_retry_s=0.2)
    annotator.start()
    try:
        assert wait_annotated(core, wanted)
        assert annotator.polling.wait(WAIT_S), "the refused watch did not fall back to the poll"
        verbs = ["get", "patch", "list", "watch"]
        rule = {"apiGroups": [""], "resources": ["nodes"], "verbs": verbs}
        client.RbacAuthorizationV1Api(api_client).patch_cluster_role(role, {"rules": [rule]})
        assert annotator.watching.wait(WAIT_S), "the watch was not tried again once granted"
        assert not annotator.polling.is_set()
        core.patch_node(NODE, {"metadata": {"annotations": {ANNOTATION_GPUS: None}}})
        assert wait_annotated(core, wanted, BACK_S)
    finally:
        annotator.stop()
    said = [r.getMessage() for r in caplog.records if "forbidden" in r.getMessage()]
    assert len(said) == 1, said


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
