"""llm-d's orchestrator API on the coordinator, over gRPC, with agents on loopback: who may
drive a job, and what GetGroupStatus and ListGroups say of groups across nodes."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from kubernetes.client import ApiClient, Configuration

from baton._pb import timeslice_orchestrator_pb2 as ts
from baton._pb import timeslice_orchestrator_pb2_grpc as ts_grpc
from baton.contract.names import LABEL_JOB, RESOURCE_GPU
from coordinator.callers import PodCallers
from coordinator.cluster import Member, member_of
from coordinator.llmd import LlmdOrchestrator
from coordinator.turns import Arbiter
from tests.coordinator.loopback import LoopbackNode, leading, view_of

JOBS = {
    "rl": [("team/rl-trainer", "n1", "train"), ("team/rl-sampler", "n2", "sample")],
    "eval": [("other/eval-a", "n1", "train")],
}


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 30))


async def serve(
    tmp_path: Path,
    caller: str | None,
    allow_unidentified: bool = False,
    heard: asyncio.Queue[str] | None = None,
    identify: Callable[[str, bool], Awaitable[str | None]] | None = None,
) -> tuple[list[LoopbackNode], Arbiter, grpc.aio.Server, ts_grpc.TimeSliceOrchestratorServiceStub]:
    """The coordinator's llm-d service over two loopback nodes; each call's peer goes to `heard`
    as the call is identified (it then reaches the arbiter without waiting on anything); its
    caller is `caller`, or whom `identify` finds."""
    nodes = [
        await LoopbackNode(name, tmp_path / name, (f"GPU-{name}",)).start() for name in ("n1", "n2")
    ]
    view = view_of(nodes, JOBS)
    arbiter = await leading(view)

    async def namespace_of(peer: str, ending: bool) -> str | None:
        if heard is not None:
            heard.put_nowait(peer)
        return caller

    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    servicer = LlmdOrchestrator(arbiter, view, identify or namespace_of, allow_unidentified)
    ts_grpc.add_TimeSliceOrchestratorServiceServicer_to_server(servicer, server)
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    return nodes, arbiter, server, ts_grpc.TimeSliceOrchestratorServiceStub(channel)


async def shut(nodes: list[LoopbackNode], arbiter: Arbiter, server: grpc.aio.Server) -> None:
    await server.stop(0)
    await arbiter.close()
    await arbiter.links.close()
    for node in nodes:
        await node.stop()


def test_a_caller_from_another_namespace_is_refused_and_its_own_is_served(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        nodes, arbiter, server, stub = await serve(tmp_path, caller="other")
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await stub.Acquire(ts.AcquireRequest(job_id="rl", group_id="train"), timeout=5)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "namespace other may drive only its own namespace's jobs" in str(
            denied.value.details()
        )
        assert "job 'rl' is in namespace team" in str(denied.value.details())
        assert not any(node.holders() for node in nodes)
        answer = await stub.Acquire(ts.AcquireRequest(job_id="eval", group_id="train"), timeout=5)
        assert answer.success
        await shut(nodes, arbiter, server)

    run(body)


def test_an_unidentified_caller_is_refused_unless_the_operator_allows_it(tmp_path: Path) -> None:
    async def body() -> None:
        nodes, arbiter, server, stub = await serve(tmp_path, caller=None)
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await stub.Acquire(ts.AcquireRequest(job_id="rl"), timeout=5)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "no pod this coordinator can identify" in str(denied.value.details())
        await shut(nodes, arbiter, server)

    run(body)


def test_a_caller_known_only_as_it_gives_a_turn_back_yields_its_jobs_turn_and_takes_none(
    tmp_path: Path,
) -> None:
    """A pod in its grace period (`coordinator.callers`): its Yield ends its job's turn on every
    node; its Acquire is refused as from nobody."""

    async def leaving(peer: str, ending: bool) -> str | None:
        return "team" if ending else None

    async def body() -> None:
        nodes, arbiter, server, stub = await serve(tmp_path, None, identify=leaving)
        try:
            await arbiter.acquire("team", "rl", "train", timeout=5)
            assert nodes[0].holders() == {"GPU-n1": "team/rl-trainer"}
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await stub.Acquire(ts.AcquireRequest(job_id="rl", group_id="train"), timeout=5)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "no pod this coordinator can identify" in str(denied.value.details())
            answer = await stub.Yield(ts.YieldRequest(job_id="rl", group_id="train"), timeout=5)
            assert answer.success
            assert nodes[0].holders() == {}
        finally:
            await shut(nodes, arbiter, server)

    run(body)


def test_groups_across_nodes_are_listed_and_their_state_follows_the_turns(tmp_path: Path) -> None:
    async def body() -> None:
        nodes, arbiter, server, stub = await serve(tmp_path, caller="team")
        groups = await stub.ListGroups(ts.ListGroupsRequest(), timeout=5)
        assert list(groups.group_ids) == ["sample", "train"]
        status = await stub.GetGroupStatus(ts.GetGroupStatusRequest(group_id="train"), timeout=5)
        assert status.group.group_state == ts.GroupStatus.STATE_IDLE
        await stub.Acquire(ts.AcquireRequest(job_id="rl", group_id="train"), timeout=5)
        assert nodes[0].holders() == {"GPU-n1": "team/rl-trainer"}
        assert nodes[1].holders() == {}  # the sampler group is not part of the trainer's turn
        status = await stub.GetGroupStatus(ts.GetGroupStatusRequest(group_id="train"), timeout=5)
        assert status.group.group_state == ts.GroupStatus.STATE_LOCKED
        assert (status.group.locking_job, status.group.loaded_job) == ("rl", "rl")
        assert [(s.agent, s.job_id) for s in status.agent_job_states] == [("n1", "rl")]
        answer = await stub.Yield(ts.YieldRequest(job_id="rl", group_id="train"), timeout=5)
        assert (answer.success, answer.pending_waiters, answer.snapshot_deferred) == (True, 0, True)
        status = await stub.GetGroupStatus(ts.GetGroupStatusRequest(group_id="train"), timeout=5)
        assert status.group.group_state == ts.GroupStatus.STATE_IDLE_YIELDED
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await stub.GetGroupStatus(ts.GetGroupStatusRequest(group_id="nope"), timeout=5)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        await shut(nodes, arbiter, server)

    run(body)


@pytest.mark.parametrize(
    ("caller", "held_by"),
    [
        ("team", "a job of another namespace"),  # other/eval's name is its namespace's
        (None, "job other/eval@train"),  # --allow-unidentified: it may drive any job
    ],
)
def test_an_acquire_whose_deadline_passes_hears_which_job_holds_the_group_if_it_may_see_it(
    tmp_path: Path, caller: str | None, held_by: str
) -> None:
    async def body() -> None:
        nodes, arbiter, server, stub = await serve(tmp_path, caller, allow_unidentified=True)
        try:
            await arbiter.acquire("other", "eval", "train", timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as late:
                await stub.Acquire(ts.AcquireRequest(job_id="rl", group_id="train"), timeout=1)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert late.value.details() == (
                f"job team/rl@train: no turn before the deadline; its GPUs were held by {held_by}"
            )
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await stub.Yield(ts.YieldRequest(job_id="rl", group_id="train"), timeout=5)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert denied.value.details() == (
                f"job team/rl does not hold the turn on group 'train' "
                f"(held by {held_by.removeprefix('job ')})"
            )
        finally:
            await shut(nodes, arbiter, server)

    run(body)


def test_an_acquire_asked_again_after_its_deadline_passed_gets_the_turn_that_was_prepared(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        heard: asyncio.Queue[str] = asyncio.Queue()
        nodes, arbiter, server, stub = await serve(tmp_path, caller="team", heard=heard)
        try:
            blocker = nodes[0].add_pod("team/local", ("GPU-n1",))
            held = await nodes[0].service.acquire(blocker, (), timeout=5)  # n1 waits for it
            request = ts.AcquireRequest(job_id="rl", group_id="train")
            with pytest.raises(grpc.aio.AioRpcError) as late:
                await stub.Acquire(request, timeout=1)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "being prepared" in str(late.value.details())
            await heard.get()
            retry = asyncio.ensure_future(stub.Acquire(request, timeout=10))
            await heard.get()  # the retry waits beside the turn being prepared
            nodes[0].service.yield_(blocker, held.lease.lease_id)
            answer = await retry
            assert answer.success is True
            assert nodes[0].holders() == {"GPU-n1": "team/rl-trainer"}
            yielded = await stub.Yield(ts.YieldRequest(job_id="rl", group_id="train"), timeout=5)
            assert yielded.success is True
        finally:
            await shut(nodes, arbiter, server)

    run(body)


def test_a_job_that_does_not_exist_or_is_not_scheduled_yet_is_named_as_such(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        nodes, arbiter, server, stub = await serve(tmp_path, caller="team")
        labels = {LABEL_JOB: "later"}
        meta = {"name": "later-a", "namespace": "team", "labels": labels}
        asks = {"resources": {"limits": {RESOURCE_GPU: "1"}}}
        spec = {"containers": [{"name": "main", **asks}]}
        read = member_of({"metadata": meta, "spec": spec})  # created, not bound to a node yet
        assert read is not None
        arbiter.view.members["team/later-a"] = read
        answers = {}
        for job in ("nope", "later"):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Acquire(ts.AcquireRequest(job_id=job), timeout=5)
            answers[job] = (refused.value.code(), refused.value.details())
        assert answers == {
            "nope": (grpc.StatusCode.NOT_FOUND, "no pod carries job 'nope'"),
            "later": (
                grpc.StatusCode.FAILED_PRECONDITION,
                "job team/later: none of its pods is scheduled on a node yet (team/later-a)",
            ),
        }
        assert list((await stub.ListGroups(ts.ListGroupsRequest(), timeout=5)).group_ids) == [
            "sample",
            "train",
        ]
        await shut(nodes, arbiter, server)

    run(body)


def test_a_jobs_pod_that_asks_for_no_gpu_takes_no_part_in_its_turn(tmp_path: Path) -> None:
    """A job's driver pod (CPU only, no Baton GPU, no device claim) on a node of the job: no
    agent counts it, so the turn is prepared for the job's GPU pods alone; a job of such pods
    only is refused at once, saying so."""

    async def body() -> None:
        nodes, arbiter, server, stub = await serve(tmp_path, caller="team")
        for name, job in (("rl-driver", "rl"), ("cpu-only", "etl")):
            meta = {"name": name, "namespace": "team", "labels": {LABEL_JOB: job}}
            spec = {"nodeName": "n1", "containers": [{"name": "main"}]}
            read = member_of({"metadata": meta, "spec": spec, "status": {"phase": "Running"}})
            assert read is not None
            arbiter.view.members[f"team/{name}"] = read
        answer = await stub.Acquire(ts.AcquireRequest(job_id="rl"), timeout=5)
        assert answer.success
        assert nodes[0].holders() == {"GPU-n1": "team/rl-trainer"}
        assert nodes[1].holders() == {"GPU-n2": "team/rl-sampler"}
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Acquire(ts.AcquireRequest(job_id="etl"), timeout=5)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.details() == (
            "job team/etl: none of its pods asks for a Baton GPU (team/cpu-only), so it has no "
            "turn to take"
        )
        await stub.Yield(ts.YieldRequest(job_id="rl"), timeout=5)
        await shut(nodes, arbiter, server)

    run(body)


def test_two_pods_of_a_job_on_one_gpu_are_refused_at_once_even_while_another_job_holds_it(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        nodes, arbiter, server, stub = await serve(tmp_path, caller="team")
        critic = nodes[0].add_pod("team/rl-critic", ("GPU-n1",), "rl")  # beside rl-trainer
        arbiter.view.members["team/rl-critic"] = (
            "team",
            "rl",
            Member(critic.tenant_id, "n1", critic.gpus),
        )
        await arbiter.acquire("other", "eval", "", timeout=5)  # n1's GPU is another job's now
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # not at its deadline: at once
            await stub.Acquire(ts.AcquireRequest(job_id="rl"), timeout=2)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.details() == (
            "pods team/rl-critic and team/rl-trainer of job team/rl share GPU GPU-n1 on node n1: "
            "a job's turn needs each of its pods on GPUs of its own"
        )
        assert not arbiter.table.waiters  # it does not keep a place in the queue either
        await shut(nodes, arbiter, server)

    run(body)


def test_a_caller_sees_the_groups_it_shares_and_only_its_own_namespaces_jobs_named(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        nodes, arbiter, server, stub = await serve(tmp_path, caller="other")
        try:
            await arbiter.acquire("team", "rl", "train", timeout=5)
            train = ts.GetGroupStatusRequest(group_id="train")
            status = await stub.GetGroupStatus(train, timeout=5)
            assert status.group.group_state == ts.GroupStatus.STATE_LOCKED
            named = (status.group.locking_job, status.group.active_job, status.group.loaded_job)
            assert named == ("", "", "")
            assert [(s.agent, s.job_id) for s in status.agent_job_states] == [("n1", "")]
            groups = await stub.ListGroups(ts.ListGroupsRequest(), timeout=5)
            assert list(groups.group_ids) == ["train"]  # "sample" is only team's pods' label
            with pytest.raises(grpc.aio.AioRpcError) as hidden:
                await stub.GetGroupStatus(ts.GetGroupStatusRequest(group_id="sample"), timeout=5)
            assert hidden.value.code() == grpc.StatusCode.NOT_FOUND
            await arbiter.yield_("team", "rl", "train")
            await stub.Acquire(ts.AcquireRequest(job_id="eval", group_id="train"), timeout=5)
            status = await stub.GetGroupStatus(train, timeout=5)
            assert (status.group.locking_job, status.group.loaded_job) == ("eval", "eval")
        finally:
            await shut(nodes, arbiter, server)

    run(body)


@pytest.mark.parametrize("allowed", [False, True])
def test_an_unidentified_caller_sees_jobs_named_only_where_allowed_to_drive_them(
    tmp_path: Path, allowed: bool
) -> None:
    async def body() -> None:
        nodes, arbiter, server, stub = await serve(tmp_path, None, allow_unidentified=allowed)
        try:
            groups = await stub.ListGroups(ts.ListGroupsRequest(), timeout=5)
            # the loopback nodes name no group: the pods' labels are seen only where allowed
            assert list(groups.group_ids) == (["sample", "train"] if allowed else [])
            await arbiter.acquire("team", "rl", "train", timeout=5)
            if allowed:
                request = ts.GetGroupStatusRequest(group_id="train")
                status = await stub.GetGroupStatus(request, timeout=5)
                assert status.group.group_state == ts.GroupStatus.STATE_LOCKED
                # the operator lets it drive any job: names hide nothing from it
                assert status.group.locking_job == "rl"
        finally:
            await shut(nodes, arbiter, server)

    run(body)


def test_a_caller_met_while_the_api_server_cannot_be_asked_hears_unavailable_not_denied(
    tmp_path: Path,
) -> None:
    with socket.socket() as probe:  # a port nothing listens on: the API server is down
        probe.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{probe.getsockname()[1]}"
    api = ApiClient(Configuration(host=down))
    api.configuration.retries = 0
    callers = PodCallers(api)

    async def body() -> None:
        nodes, arbiter, server, stub = await serve(
            tmp_path, None, allow_unidentified=True, identify=callers.namespace
        )
        try:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await stub.Acquire(ts.AcquireRequest(job_id="rl", group_id="train"), timeout=20)
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "cannot tell who calls from 127.0.0.1" in str(failed.value.details())
            assert not any(node.holders() for node in nodes)  # not driven as an unidentified one
        finally:
            await shut(nodes, arbiter, server)

    run(body)
