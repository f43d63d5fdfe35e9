"""In Kubernetes: tenants are the pods on this node, found from a caller's cgroup."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client

from agent.client import Baton
from agent.client.errors import PermissionDenied
from agent.node.podwatch import PodWatcher
from agent.wire.handshake import handshake_path, request_token
from baton._pb import agent_pb2 as pb
from baton._pb import agent_pb2_grpc
from baton.contract import names
from baton.contract.kube import load_api_client
from tests.e2e.processes import poll
from tests.harness.agent import AgentRunner
from tests.harness.fakeapi import FakeApiServer

UID = "6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b"


def pod(name: str, uid: str, node: str, gpus: str | None) -> dict[str, Any]:
    annotations = {names.ANNOTATION_ASSIGNED_GPUS: gpus} if gpus else {}
    resources = {
        "requests": {names.RESOURCE_GPU_MEMORY: "20480", names.RESOURCE_GPU_DUTY: "40"},
        "limits": {"memory": "64Gi", names.RESOURCE_GPU: "1"},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team", "uid": uid, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "trainer", "resources": resources}],
        },
        "status": {"phase": "Running"},
    }


def test_pod_tenant_from_cgroup_and_pod_watch(workdir: str, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / str(os.getpid())).mkdir(parents=True)
    (proc / str(os.getpid()) / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-abc.scope\n"
    )
    with FakeApiServer() as api:
        api.put_object(pod("trainer", UID, "node-1", "GPU-bbb,GPU-aaa"))
        api.put_object(pod("elsewhere", "11111111-2222-4333-8444-555555555555", "node-2", "GPU-x"))
        api.put_object(pod("plain", "21111111-2222-4333-8444-555555555555", "node-1", None))
        kubeconfig = str(api.kubeconfig_path(tmp_path))
        runner = AgentRunner(
            workdir, node_name="node-1", kubeconfig=kubeconfig, proc_root=str(proc)
        ).start()
        baton = Baton(runner.socket, name="ignored-in-a-pod", connect_timeout=5)
        try:
            runner.wait_event(lambda e: e.kind == "tenant_joined" and e.tenant_id == "team/trainer")
            lease = baton.acquire()
            assert lease.gpus == ("GPU-aaa", "GPU-bbb")
            tenant = runner.status()["tenants"]["team/trainer"]
            assert tenant["source"] == "pod" and tenant["pod_uid"] == UID
            assert (tenant["gpu_memory_mib"], tenant["gpu_duty"]) == (20480, 40)
            assert tenant["memory_limit_bytes"] == 64 * 1024**3
            assert set(runner.status()["tenants"]) == {"team/trainer"}

            mark = runner.mark()
            baton.close()  # its last process leaves; the pod stays on the node
            ended = runner.wait_event(lambda e: e.kind == "tenant_gone", since=mark)
            assert ended.detail == (
                "its last session ended; its pod stays listed, with no process, until it leaves"
                " the node"
            )
            assert set(runner.status()["tenants"]) == {"team/trainer"}

            mark = runner.mark()
            api.remove_object("Pod", "trainer", "team")
            gone = runner.wait_event(lambda e: e.kind == "tenant_gone", since=mark)
            assert gone.tenant_id == "team/trainer" and "pod left" in gone.detail
            assert runner.status()["gpus"]["GPU-aaa"]["holder"] is None

            api.put_object(pod("trainer", UID, "node-1", "GPU-aaa"))
            runner.wait_event(lambda e: e.kind == "tenant_joined", since=mark)
            runner.stop()  # the pod leaves while the agent is down: the relist notices
            api.remove_object("Pod", "trainer", "team")
            runner = AgentRunner(
                workdir, node_name="node-1", kubeconfig=kubeconfig, proc_root=str(proc)
            ).start()
            runner.wait_event(lambda e: e.kind == "tenant_gone" and e.tenant_id == "team/trainer")
            assert runner.status()["tenants"] == {}
        finally:
            baton.close()
            runner.stop()


def test_a_containers_process_takes_turns_on_its_own_containers_gpus(
    workdir: str, tmp_path: Path
) -> None:
    learner, actor = "a" * 64, "b" * 64
    proc = tmp_path / "proc"
    (proc / str(os.getpid())).mkdir(parents=True)
    (proc / str(os.getpid()) / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{actor}.scope\n"
    )
    two = pod("trainer", UID, "node-1", "GPU-aaa,GPU-bbb")
    two["metadata"]["annotations"][names.ANNOTATION_CONTAINER_GPUS] = json.dumps(
        {"learner": ["GPU-aaa"], "actor": ["GPU-bbb"]}
    )
    main = two["spec"]["containers"][0]
    two["spec"]["containers"] = [{**main, "name": "learner"}, {**main, "name": "actor"}]
    two["status"]["containerStatuses"] = [
        {
            "name": n,
            "containerID": f"containerd://{cid}",
            "ready": True,
            "restartCount": 0,
            "image": "trainer",
            "imageID": "",
        }
        for n, cid in (("learner", learner), ("actor", actor))
    ]
    with FakeApiServer() as api:
        api.put_object(two)
        kubeconfig = str(api.kubeconfig_path(tmp_path))
        runner = AgentRunner(
            workdir, node_name="node-1", kubeconfig=kubeconfig, proc_root=str(proc)
        ).start()
        baton = Baton(runner.socket, connect_timeout=5)
        try:
            runner.wait_event(lambda e: e.kind == "tenant_joined" and e.tenant_id == "team/trainer")
            tenant = runner.status()["tenants"]["team/trainer"]
            assert tenant["gpus"] == ["GPU-aaa", "GPU-bbb"]
            assert tenant["container_gpus"] == {"actor": ["GPU-bbb"], "learner": ["GPU-aaa"]}
            assert tenant["containers"] == {learner: "learner", actor: "actor"}
            lease = baton.acquire()
            assert lease.gpus == ("GPU-bbb",), "the actor's GPU, not the whole pod's"
            assert runner.status()["gpus"]["GPU-aaa"]["holder"] is None
            baton.yield_()
        finally:
            baton.close()
            runner.stop()


def test_serving_pods_refuses_local_tenants_unless_allowed(workdir: str, tmp_path: Path) -> None:
    """A process in no pod may register only when the agent runs with --allow-local-tenants."""
    (tmp_path / "proc").mkdir()
    with FakeApiServer() as api:
        kubeconfig = str(api.kubeconfig_path(tmp_path))
        for allowed in (False, True):
            runner = AgentRunner(
                workdir,
                node_name="node-1",
                kubeconfig=kubeconfig,
                proc_root=str(tmp_path / "proc"),
                allow_local_tenants=allowed,
            ).start()
            try:
                if not allowed:
                    refused = Baton(runner.socket, ["GPU-0"], name="local", connect_timeout=5)
                    with pytest.raises(PermissionDenied, match="--allow-local-tenants"), refused:
                        refused.acquire(timeout=5)
                    assert runner.status()["tenants"] == {}
                    continue
                with Baton(runner.socket, ["GPU-0"], name="local", connect_timeout=5) as baton:
                    assert baton.acquire().gpus == ("GPU-0",)
                    assert set(runner.status()["tenants"]) == {"local/local"}
            finally:
                runner.stop()


def test_a_local_users_cgroup_named_like_a_pods_is_not_that_pod(
    workdir: str, tmp_path: Path
) -> None:
    """systemd delegates `user.slice/user-UID.slice/user@UID.service` to the user: any local
    user may make a cgroup there named like a pod's and move in. Such a process is in no pod:
    refused (local tenants are), not the pod's tenant taking the pod's turn."""
    proc = tmp_path / "proc"
    (proc / str(os.getpid())).mkdir(parents=True)
    (proc / str(os.getpid()) / "cgroup").write_text(
        "0::/user.slice/user-1000.slice/user@1000.service/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{'c' * 64}.scope\n"
    )
    with FakeApiServer() as api:
        api.put_object(pod("trainer", UID, "node-1", "GPU-aaa"))
        kubeconfig = str(api.kubeconfig_path(tmp_path))
        runner = AgentRunner(
            workdir, node_name="node-1", kubeconfig=kubeconfig, proc_root=str(proc)
        ).start()
        try:
            runner.wait_event(lambda e: e.kind == "tenant_joined" and e.tenant_id == "team/trainer")
            spoofer = Baton(runner.socket, ["GPU-aaa"], name="spoof", connect_timeout=5)
            with pytest.raises(PermissionDenied, match="runs in no pod"), spoofer:
                spoofer.acquire(timeout=5)
            assert runner.status()["gpus"]["GPU-aaa"]["holder"] is None
        finally:
            runner.stop()


def test_a_token_acts_for_the_pod_its_process_ran_in_as_it_connected(
    workdir: str, tmp_path: Path
) -> None:
    """A token outlives its process, whose PID may go to a process of another pod: calls with
    it act for the pod the handshake saw, never for the pod of whoever has that PID now."""
    other = "11111111-2222-4333-8444-555555555555"
    cgroup = tmp_path / "proc" / str(os.getpid()) / "cgroup"
    cgroup.parent.mkdir(parents=True)

    def in_pod(uid: str) -> None:  # what the kernel says of this test's PID from now on
        cgroup.write_text(f"0::/kubepods/burstable/pod{uid}/{'c' * 64}\n")

    with FakeApiServer() as api:
        api.put_object(pod("victim", UID, "node-1", "GPU-aaa"))
        api.put_object(pod("attacker", other, "node-1", "GPU-bbb"))
        kubeconfig = str(api.kubeconfig_path(tmp_path))
        runner = AgentRunner(
            workdir, node_name="node-1", kubeconfig=kubeconfig, proc_root=str(tmp_path / "proc")
        ).start()
        in_pod(UID)
        victim = Baton(runner.socket, connect_timeout=5)
        try:
            for tenant_id in ("team/victim", "team/attacker"):
                runner.wait_event(lambda e: e.kind == "tenant_joined" and e.tenant_id == tenant_id)  # noqa: B023
            assert victim.acquire().gpus == ("GPU-aaa",)
            in_pod(other)  # the attacker's process takes a token, then exits ...
            token = request_token(handshake_path(runner.socket))
            in_pod(UID)  # ... and its PID goes to a process of the victim's pod
            with grpc.insecure_channel(f"unix:{runner.socket}") as channel:
                stub = agent_pb2_grpc.AgentStub(channel)
                metadata = (("baton-session", token),)
                with pytest.raises(grpc.RpcError) as refused:
                    stub.Yield(pb.YieldRequest(), metadata=metadata, timeout=5)
                assert "team/attacker holds no leases" in str(refused.value.details())
            assert runner.status()["gpus"]["GPU-aaa"]["holder"] == "team/victim"
            victim.yield_()
        finally:
            victim.close()
            runner.stop()


def test_stop_ends_the_watch_thread_while_its_watch_waits(tmp_path: Path) -> None:
    """`stop` interrupts the watch's read and waits for the thread: a daemon thread left reading
    at interpreter exit can wake during finalization and abort the agent (SIGABRT)."""
    loop = asyncio.new_event_loop()
    joined: list[str] = []
    with FakeApiServer() as api:
        api.put_object(pod("trainer", UID, "node-1", "GPU-aaa"))
        watcher = PodWatcher(
            load_api_client(str(api.kubeconfig_path(tmp_path))),
            "node-1",
            loop,
            lambda tenant: joined.append(tenant.tenant_id),
            lambda tenant_id: None,
        )
        try:
            watcher.start()
            api.wait_for_requests("watch", "pods")  # listed, and now waiting for events
        finally:
            watcher.stop()
            loop.call_soon(loop.stop)
            loop.run_forever()  # hand over what the thread queued
            loop.close()
        assert not [t for t in threading.enumerate() if t.name == "podwatch"]
    assert joined == ["team/trainer"]


def test_stop_ends_the_thread_while_the_api_server_never_answers() -> None:
    """A request the server accepts and never answers: `stop` cuts its connection, so the
    thread is gone at once. (How the watch treats an ERROR event, 410 or other, is the
    reflector's: tests/contract/test_reflector.py.)"""
    accepted: list[socket.socket] = []
    done = threading.Event()
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.05)

    def accept() -> None:
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                accepted.append(server.accept()[0])

    acceptor = threading.Thread(target=accept, name="silent-api")
    acceptor.start()
    loop = asyncio.new_event_loop()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.getsockname()[1]}"
    watcher = PodWatcher(
        client.ApiClient(configuration),
        "node-1",
        loop,
        lambda t: None,
        lambda i: None,
        request_timeout_s=30,
    )
    try:
        watcher.start()
        poll("the watch's list to connect", lambda: accepted or None, 10)
        began = time.monotonic()
        watcher.stop()
        assert not [t for t in threading.enumerate() if t.name == "podwatch"]
        assert time.monotonic() - began < 5, "stop() waited out the request's timeout"
    finally:
        done.set()
        acceptor.join(5)
        for conn in accepted:
            conn.close()
        server.close()
        loop.close()
