"""The fake API server, driven by the real `kubernetes` client."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import urllib3
from kubernetes import client, watch

from baton.contract.kube import load_api_client
from tests.harness.fakeapi import FakeApiServer


def pod(name: str, node: str = "", labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def status_of(err: client.ApiException) -> dict[str, Any]:
    body = json.loads(err.body or "{}")
    assert body["kind"] == "Status"
    assert body["code"] == err.status
    return body


def bind(core: Any, name: str, node: str, ns: str = "default") -> Any:
    body = {"metadata": {"name": name}, "target": {"kind": "Node", "name": node}}
    # The server answers a Status, which the client cannot read as a V1Binding.
    return core.create_namespaced_pod_binding(name, ns, body, _preload_content=False)


def test_create_get_list_patch_delete(core: Any) -> None:
    node = core.create_node({"metadata": {"name": "gpu-1", "annotations": {"x": "1"}}})
    created = core.create_namespaced_pod("team-a", pod("p1"))
    assert created.metadata.namespace == "team-a" and created.metadata.uid
    assert created.status.phase == "Pending" and created.metadata.creation_timestamp
    assert int(created.metadata.resource_version) > int(node.metadata.resource_version)

    assert core.read_node("gpu-1").metadata.annotations == {"x": "1"}
    patched = core.patch_node("gpu-1", {"metadata": {"annotations": {"x": None, "y": "2"}}})
    assert patched.metadata.annotations == {"y": "2"}
    assert [p.metadata.name for p in core.list_namespaced_pod("team-a").items] == ["p1"]
    assert core.list_namespaced_pod("team-b").items == []

    deleted = core.delete_namespaced_pod("p1", "team-a")
    assert deleted.metadata.name == "p1"
    with pytest.raises(client.ApiException) as missing:
        core.read_namespaced_pod("p1", "team-a")
    body = status_of(missing.value)
    assert (body["reason"], body["message"]) == ("NotFound", 'pods "p1" not found')


def test_create_existing_name_is_already_exists(core: Any) -> None:
    core.create_namespaced_pod("default", pod("p1"))
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_pod("default", pod("p1"))
    assert err.value.status == 409 and status_of(err.value)["reason"] == "AlreadyExists"


def test_field_and_label_selectors(core: Any) -> None:
    core.create_namespaced_pod("a", pod("bound", node="gpu-1", labels={"app": "rl"}))
    core.create_namespaced_pod("b", pod("pending", labels={"app": "sft", "tier": "x"}))

    def names(**kw: Any) -> list[str]:
        return [p.metadata.name for p in core.list_pod_for_all_namespaces(**kw).items]

    assert names(field_selector="spec.nodeName=gpu-1") == ["bound"]
    assert names(field_selector="spec.nodeName=") == ["pending"]
    assert names(field_selector="spec.nodeName!=") == ["bound"]
    assert names(field_selector="metadata.namespace=b,metadata.name=pending") == ["pending"]
    assert names(label_selector="app=rl") == ["bound"]
    assert names(label_selector="app in (rl, sft),tier") == ["pending"]
    assert names(label_selector="!tier") == ["bound"]
    assert names(label_selector="app notin (rl)") == ["pending"]
    with pytest.raises(client.ApiException) as err:
        core.list_pod_for_all_namespaces(field_selector="spec.priority=3")
    assert err.value.status == 400


def test_list_pages_with_limit_and_continue(core: Any) -> None:
    for i in range(5):
        core.create_namespaced_pod("default", pod(f"p{i}"))
    first = core.list_namespaced_pod("default", limit=2)
    second = core.list_namespaced_pod("default", limit=10, _continue=first.metadata._continue)
    assert [p.metadata.name for p in first.items] == ["p0", "p1"]
    assert [p.metadata.name for p in second.items] == ["p2", "p3", "p4"]
    assert second.metadata._continue is None
    assert first.metadata.remaining_item_count == 3


def test_a_paged_list_is_one_snapshot_whatever_changes_between_pages(core: Any) -> None:
    """As on a real server: later pages read the first page's revision, so an object deleted
    meanwhile neither shifts the pages nor hides another, and a watch from the list's version
    shows what changed on a page already read."""
    for i in range(6):
        core.create_namespaced_pod("default", pod(f"p{i}"))
    first = core.list_namespaced_pod("default", limit=2)
    core.delete_namespaced_pod("p0", "default")
    bind(core, "p1", "gpu-1")
    core.create_namespaced_pod("default", pod("p9"))
    rest = core.list_namespaced_pod("default", limit=10, _continue=first.metadata._continue)
    assert [p.metadata.name for p in first.items] == ["p0", "p1"]
    assert [p.metadata.name for p in rest.items] == ["p2", "p3", "p4", "p5"]
    version = first.metadata.resource_version
    assert rest.metadata.resource_version == version
    stream = watch.Watch().stream(
        core.list_namespaced_pod, "default", resource_version=version, timeout_seconds=1
    )
    seen = [(e["type"], e["object"].metadata.name, e["object"].spec.node_name) for e in stream]
    assert seen == [("DELETED", "p0", None), ("MODIFIED", "p1", "gpu-1"), ("ADDED", "p9", None)]


def test_cluster_scoped_pages_and_selected_pages(core: Any) -> None:
    """Nodes page by name from one snapshot too; with a selector the remaining count is
    unknown, so left out, as on a real server."""
    for i in range(5):
        core.create_node({"metadata": {"name": f"gpu-{i}", "labels": {"pool": "a"}}})
    first = core.list_node(limit=2)
    core.delete_node("gpu-2")
    rest = core.list_node(limit=10, _continue=first.metadata._continue)
    names = [n.metadata.name for n in [*first.items, *rest.items]]
    assert names == [f"gpu-{i}" for i in range(5)]
    selected = core.list_node(limit=1, label_selector="pool=a")
    assert selected.metadata._continue and selected.metadata.remaining_item_count is None


def test_compaction_ends_continue_tokens(fake_api: FakeApiServer, core: Any) -> None:
    for i in range(3):
        core.create_namespaced_pod("default", pod(f"p{i}"))
    first = core.list_namespaced_pod("default", limit=1)
    fake_api.compact_history()
    with pytest.raises(client.ApiException) as err:
        core.list_namespaced_pod("default", limit=1, _continue=first.metadata._continue)
    assert err.value.status == 410 and status_of(err.value)["reason"] == "Expired"


def test_a_continue_token_outliving_its_snapshot_is_gone(core: Any) -> None:
    from tests.harness.kubestore import SNAPSHOTS_KEPT

    for i in range(3):
        core.create_namespaced_pod("default", pod(f"p{i}"))
    first = core.list_namespaced_pod("default", limit=1)
    for i in range(SNAPSHOTS_KEPT):
        core.create_namespaced_pod("default", pod(f"q{i}"))
        core.list_namespaced_pod("default", limit=1)
    with pytest.raises(client.ApiException) as err:
        core.list_namespaced_pod("default", limit=1, _continue=first.metadata._continue)
    body = status_of(err.value)
    assert err.value.status == 410 and body["reason"] == "Expired"
    assert body["message"].startswith("The provided continue parameter is too old")


def test_stale_resource_version_conflicts(core: Any) -> None:
    old = core.create_namespaced_pod("default", pod("p1"))
    core.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {"a": "1"}}})
    stale = {"metadata": {"resourceVersion": old.metadata.resource_version, "labels": {"b": "2"}}}
    with pytest.raises(client.ApiException) as err:
        core.patch_namespaced_pod("p1", "default", stale)
    body = status_of(err.value)
    assert body["reason"] == "Conflict" and body["status"] == "Failure"
    assert body["message"].endswith(
        "the object has been modified; please apply your changes to the latest version and try"
        " again"
    )
    assert core.read_namespaced_pod("p1", "default").metadata.labels == {"a": "1"}


def test_json_patch_with_escaped_annotation_key(core: Any) -> None:
    core.create_namespaced_pod("default", pod("p1"))
    ops = [
        {"op": "add", "path": "/metadata/annotations", "value": {}},
        {"op": "add", "path": "/metadata/annotations/baton.dev~1assigned-gpus", "value": "GPU-1"},
    ]
    patched = core.patch_namespaced_pod("p1", "default", ops)
    assert patched.metadata.annotations == {"baton.dev/assigned-gpus": "GPU-1"}
    failing = [{"op": "test", "path": "/metadata/name", "value": "other"}]
    with pytest.raises(client.ApiException) as err:
        core.patch_namespaced_pod("p1", "default", failing)
    assert err.value.status == 422


def test_pod_spec_node_name_cannot_be_patched(core: Any) -> None:
    core.create_namespaced_pod("default", pod("p1"))
    with pytest.raises(client.ApiException) as err:
        core.patch_namespaced_pod("p1", "default", {"spec": {"nodeName": "gpu-1"}})
    assert err.value.status == 422


def test_rejects_unknown_media_type_and_malformed_bodies(fake_api: FakeApiServer) -> None:
    fake_api.put_object({"kind": "Node", "metadata": {"name": "gpu-1"}})
    url = f"{fake_api.url}/api/v1/nodes/gpu-1"
    with httpx.Client(timeout=5) as http:
        wrong = http.patch(url, content=b"{}", headers={"Content-Type": "text/plain"})
        broken = http.patch(
            url, content=b"{nope", headers={"Content-Type": "application/merge-patch+json"}
        )
        unknown = http.get(f"{fake_api.url}/api/v1/widgets")
    assert (wrong.status_code, wrong.json()["reason"]) == (415, "UnsupportedMediaType")
    assert (broken.status_code, broken.json()["reason"]) == (400, "BadRequest")
    assert unknown.status_code == 404


def test_binding_sets_node_once(core: Any, fake_api: FakeApiServer) -> None:
    core.create_namespaced_pod("default", pod("p1"))
    response = bind(core, "p1", "gpu-1")
    assert response.status == 201 and json.loads(response.data)["status"] == "Success"
    assert core.read_namespaced_pod("p1", "default").spec.node_name == "gpu-1"

    with pytest.raises(client.ApiException) as again:
        bind(core, "p1", "gpu-2")
    assert again.value.status == 409 and "already assigned" in status_of(again.value)["message"]
    with pytest.raises(client.ApiException) as missing:
        bind(core, "ghost", "gpu-1")
    assert missing.value.status == 404
    core.create_namespaced_pod("default", pod("p2"))
    no_target = {"metadata": {"name": "p2"}, "target": {"kind": "Node", "name": ""}}
    with pytest.raises(client.ApiException) as bad:
        core.create_namespaced_pod_binding("p2", "default", no_target, _preload_content=False)
    assert bad.value.status == 400
    assert [r.verb for r in fake_api.requests(resource="pods/binding")] == ["create"] * 4


def test_namespaced_bindings_collection(core: Any) -> None:
    core.create_namespaced_pod("default", pod("p1"))
    body = {"metadata": {"name": "p1"}, "target": {"kind": "Node", "name": "gpu-3"}}
    core.create_namespaced_binding("default", body, _preload_content=False)
    assert core.read_namespaced_pod("p1", "default").spec.node_name == "gpu-3"


def test_deleting_a_bound_pod_leaves_it_terminating(core: Any, fake_api: FakeApiServer) -> None:
    core.create_namespaced_pod("default", pod("p1", node="gpu-1"))
    terminating = core.delete_namespaced_pod("p1", "default")
    assert terminating.metadata.deletion_timestamp is not None
    core.delete_namespaced_pod("p1", "default", grace_period_seconds=0)
    assert fake_api.get_object("Pod", "p1") is None


def collect(core: Any, count: int, **kwargs: Any) -> tuple[threading.Thread, list[dict[str, Any]]]:
    """Watch pods in a thread until `count` events arrived."""
    events: list[dict[str, Any]] = []

    def run() -> None:
        w = watch.Watch()
        for event in w.stream(core.list_pod_for_all_namespaces, timeout_seconds=10, **kwargs):
            events.append(event)
            if len(events) == count:
                w.stop()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, events


def test_watch_delivers_events_in_order(core: Any, fake_api: FakeApiServer) -> None:
    start = core.list_pod_for_all_namespaces().metadata.resource_version
    thread, events = collect(core, 4, resource_version=start)
    fake_api.wait_for_requests("watch", "pods")  # the watch is open before anything changes
    core.create_namespaced_pod("default", pod("p1"))
    core.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {"turn": "1"}}})
    core.create_namespaced_pod("other", pod("p2"))
    core.delete_namespaced_pod("p1", "default")
    thread.join(timeout=10)
    seen = [(e["type"], e["object"].metadata.name) for e in events]
    assert seen == [("ADDED", "p1"), ("MODIFIED", "p1"), ("ADDED", "p2"), ("DELETED", "p1")]
    versions = [int(e["object"].metadata.resource_version) for e in events]
    assert versions == sorted(versions) and len(set(versions)) == 4


def test_field_selected_watch_sees_binding_as_added(core: Any, fake_api: FakeApiServer) -> None:
    core.create_namespaced_pod("default", pod("p1"))
    thread, events = collect(core, 1, field_selector="spec.nodeName=gpu-1")
    fake_api.wait_for_requests("watch", "pods")
    bind(core, "p1", "gpu-1")
    thread.join(timeout=10)
    assert [(e["type"], e["object"].spec.node_name) for e in events] == [("ADDED", "gpu-1")]


def test_bookmarks_carry_the_latest_resource_version(core: Any, fake_api: FakeApiServer) -> None:
    created = core.create_namespaced_pod("default", pod("p1"))
    rv = created.metadata.resource_version
    thread, events = collect(core, 1, resource_version=rv, allow_watch_bookmarks=True)
    fake_api.wait_for_requests("watch", "pods")
    fake_api.send_bookmarks()
    thread.join(timeout=10)
    assert [e["type"] for e in events] == ["BOOKMARK"]
    assert events[0]["raw_object"]["metadata"]["resourceVersion"] == rv


def test_watch_from_expired_version_is_gone(core: Any, fake_api: FakeApiServer) -> None:
    old = core.create_namespaced_pod("default", pod("p1")).metadata.resource_version
    core.create_namespaced_pod("default", pod("p2"))
    fake_api.compact_history()
    with pytest.raises(client.ApiException) as err:
        for _event in watch.Watch().stream(
            core.list_pod_for_all_namespaces, resource_version=old, timeout_seconds=5
        ):
            pass
    assert err.value.status == 410


def test_bounded_history_expires_old_versions(tmp_path: Path) -> None:
    with FakeApiServer(history_limit=2) as server:
        core: Any = client.CoreV1Api(load_api_client(str(server.kubeconfig_path(tmp_path))))
        first = core.create_node({"metadata": {"name": "n0"}}).metadata.resource_version
        for i in range(1, 4):
            core.create_node({"metadata": {"name": f"n{i}"}})
        response = core.list_node(watch=True, resource_version=first, _preload_content=False)
        event = json.loads(response.data.splitlines()[0])
    assert event["type"] == "ERROR" and event["object"]["code"] == 410


def test_stop_ends_watches_and_start_reuses_the_port(core: Any, fake_api: FakeApiServer) -> None:
    core.create_namespaced_pod("default", pod("p1"))
    url = fake_api.url
    thread, events = collect(core, 99)
    fake_api.wait_for_requests("watch", "pods")
    fake_api.stop()
    thread.join(timeout=10)
    assert not thread.is_alive() and [e["type"] for e in events] == ["ADDED"]
    with pytest.raises(urllib3.exceptions.HTTPError):
        core.list_node(_request_timeout=2)
    fake_api.start()
    assert fake_api.url == url
    assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == ["p1"]


def test_injected_failure_then_recovery(core: Any, fake_api: FakeApiServer) -> None:
    fake_api.fail_next("create", "pods/binding", 500)
    core.create_namespaced_pod("default", pod("p1"))
    with pytest.raises(client.ApiException) as err:
        bind(core, "p1", "gpu-1")
    assert err.value.status == 500 and status_of(err.value)["reason"] == "InternalError"
    assert bind(core, "p1", "gpu-1").status == 201


def test_request_log_records_queries(core: Any, fake_api: FakeApiServer) -> None:
    core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-1")
    (logged,) = fake_api.requests(verb="list", resource="pods")
    assert logged.path == "/api/v1/pods"
    assert logged.query["fieldSelector"] == "spec.nodeName=gpu-1"
    fake_api.clear_requests()
    assert fake_api.requests() == []


def test_wait_for_object_sees_another_threads_write(fake_api: FakeApiServer) -> None:
    fake_api.put_object({"kind": "Node", "metadata": {"name": "gpu-1"}})
    writer = threading.Thread(
        target=fake_api.put_object,
        args=({"kind": "Node", "metadata": {"name": "gpu-1", "labels": {"ready": "1"}}},),
    )
    writer.start()
    node = fake_api.wait_for_object(
        "Node", "gpu-1", lambda n: bool(n and n["metadata"].get("labels")), timeout=5
    )
    writer.join(timeout=5)
    assert node is not None and node["metadata"]["labels"] == {"ready": "1"}


def test_replace_and_status_subresource(core: Any) -> None:
    created = core.create_namespaced_pod("default", pod("p1"))
    body = created.to_dict(serialize=True)
    body["metadata"]["labels"] = {"replaced": "yes"}
    replaced = core.replace_namespaced_pod("p1", "default", body)
    assert replaced.metadata.labels == {"replaced": "yes"}
    with pytest.raises(client.ApiException) as stale:
        core.replace_namespaced_pod("p1", "default", body)
    assert stale.value.status == 409
    status = core.patch_namespaced_pod_status(
        "p1", "default", {"status": {"phase": "Running"}, "metadata": {"labels": {"x": "y"}}}
    )
    assert status.status.phase == "Running" and status.metadata.labels == {"replaced": "yes"}
