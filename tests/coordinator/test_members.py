"""Member pods asking for their job's turn themselves: each pod's acquire, through its node's
agent, joins the job's cluster-wide turn; the turn ends when every pod that joined has yielded.
Agents on loopback with their `CoordinatedTurns`, the coordinator's Jobs API over real gRPC."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

from agent.core.errors import AcquireTimeout, Forbidden, NoCoordinator
from agent.node.tenants import Tenant
from agent.server import api_ops, coordinated
from agent.server.coordinated import CoordinatedTurns, JobTurnRefused
from agent.server.service import LeaseService
from baton._pb import agent_pb2 as pb
from baton._pb import jobturns_pb2_grpc as jt_grpc
from coordinator.jobs_api import JobsServicer
from coordinator.jobturn import JobTurn
from coordinator.recovery import recover
from coordinator.turns import Arbiter
from tests.coordinator.loopback import TOKEN, LoopbackNode, leading, view_of

JOBS = {
    "rl": [("team/rl-trainer", "n1", ""), ("team/rl-sampler", "n2", "")],
    "sft": [("team/sft-a", "n1", "")],
}


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 30))


@asynccontextmanager
async def cluster(
    tmp_path: Path, jobs: dict[str, list[tuple[str, str, str]]] = JOBS
) -> AsyncIterator[tuple[LoopbackNode, LoopbackNode, Arbiter]]:
    nodes = [
        await LoopbackNode(name, tmp_path / name, (f"GPU-{name}",)).start() for name in ("n1", "n2")
    ]
    view = view_of(nodes, jobs)
    arbiter = await leading(view)
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    jt_grpc.add_JobsServicer_to_server(JobsServicer(arbiter, TOKEN), server)
    await server.start()
    gates = [CoordinatedTurns(n.turns, f"127.0.0.1:{port}", TOKEN) for n in nodes]
    for node, gate in zip(nodes, gates, strict=True):
        node.service.jobs = gate
    try:
        yield nodes[0], nodes[1], arbiter
    finally:
        for gate in gates:
            await gate.close()
        await server.stop(0)
        await arbiter.close()
        await arbiter.links.close()
        for node in nodes:
            await node.stop()


def pod(node: LoopbackNode, name: str) -> Tenant:
    return node.service.tenants.tenants[f"team/{name}"]


async def acquire(service: LeaseService, tenant: Tenant, job: str = "") -> pb.Lease:
    return await api_ops.acquire(service, tenant, pb.AcquireRequest(timeout_ms=10_000, job=job))


def release(service: LeaseService, tenant: Tenant, lease: pb.Lease) -> None:
    api_ops.release(service, tenant, pb.YieldRequest(lease_id=lease.lease_id))


async def until(check: Callable[[], bool], what: str) -> None:
    """Wait (5 s at most) for `check`; `what` names it if it never comes."""
    deadline = asyncio.get_running_loop().time() + 5
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"not within 5 s: {what}"
        await asyncio.sleep(0.01)


def test_the_jobs_turn_starts_with_its_first_member_and_ends_with_its_last(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (n1, n2, arbiter):
            trainer, sampler = pod(n1, "rl-trainer"), pod(n2, "rl-sampler")
            mine = await acquire(n1.service, trainer)
            assert n1.holders() == {"GPU-n1": "team/rl-trainer"}
            assert n2.holders() == {"GPU-n2": "team/rl-sampler"}  # the whole job, on both nodes
            theirs = await acquire(n2.service, sampler)  # joins the held turn at once
            assert theirs.lease_id == n2.service.table.leases_of("team/rl-sampler")[0].lease_id
            other = asyncio.create_task(acquire(n1.service, pod(n1, "sft-a")))
            release(n1.service, trainer, mine)
            await asyncio.sleep(0.05)
            assert not other.done()  # the sampler still computes in the job's turn
            assert n1.holders() == {"GPU-n1": "team/rl-trainer"}
            release(n2.service, sampler, theirs)  # the last member leaves: the turn ends
            granted = await other
            assert granted.tenant_id == "team/sft-a"
            assert n2.holders() == {}
            assert list(arbiter.held) == ["team/sft"]

    run(body)


def test_a_pod_asking_for_a_job_not_its_own_or_an_agent_with_no_coordinator_is_refused(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (n1, _n2, arbiter):
            with pytest.raises(Forbidden, match="not a pod of job 'sft' \\(its job is 'rl'\\)"):
                await acquire(n1.service, pod(n1, "rl-trainer"), job="sft")
            n1.service.jobs = None
            with pytest.raises(NoCoordinator, match="has no coordinator"):
                await acquire(n1.service, pod(n1, "rl-trainer"), job="rl")
            assert not arbiter.held

    run(body)


def test_a_member_whose_job_a_node_fails_is_refused_at_once_naming_the_node(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (n1, n2, arbiter):
            await n2.server.stop(0)  # the sampler's node cannot prepare: no election to wait out
            asked = asyncio.get_running_loop().time()
            with pytest.raises(JobTurnRefused, match="node n2: its agent is unreachable"):
                await acquire(n1.service, pod(n1, "rl-trainer"))
            assert asyncio.get_running_loop().time() - asked < coordinated.RETRY_FIRST_S * 10
            assert not n1.holders() and not arbiter.held

    run(body)


def test_members_asking_together_share_one_turn_and_a_member_gone_from_the_cluster_leaves_it(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (n1, n2, arbiter):
            trainer, sampler = pod(n1, "rl-trainer"), pod(n2, "rl-sampler")
            both = await asyncio.gather(acquire(n1.service, trainer), acquire(n2.service, sampler))
            assert [lease.tenant_id for lease in both] == ["team/rl-trainer", "team/rl-sampler"]
            assert arbiter.held["team/rl"].joined == {"team/rl-trainer", "team/rl-sampler"}
            release(n1.service, trainer, both[0])
            del arbiter.view.members["team/rl-sampler"]  # the sampler's pod was deleted
            arbiter.prune_joined()
            while arbiter.held:  # its turn ends with the last pod in it
                await asyncio.sleep(0.01)
            while n1.holders() or n2.holders():
                await asyncio.sleep(0.01)

    run(body)


def test_a_pod_that_became_a_member_after_its_jobs_turn_began_takes_part_from_the_next_one(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (n1, n2, arbiter):
            sampler_member = arbiter.view.members.pop("team/rl-sampler")  # not scheduled yet
            trainer, sampler = pod(n1, "rl-trainer"), pod(n2, "rl-sampler")
            mine = await acquire(n1.service, trainer)  # a turn on n1 alone
            arbiter.view.members["team/rl-sampler"] = sampler_member  # scheduled now
            asked = asyncio.Event()
            join = arbiter.join

            async def joining(ns: str, job: str, group: str, pod: str, t: float | None) -> JobTurn:
                asked.set()
                return await join(ns, job, group, pod, t)

            arbiter.join = joining  # type: ignore[method-assign,assignment]
            theirs = asyncio.create_task(acquire(n2.service, sampler))
            await asyncio.wait_for(asked.wait(), 5)  # the coordinator has the sampler's ask
            release(n1.service, trainer, mine)  # the turn it could not take part in ends
            lease = await theirs  # the next turn covers the whole job
            assert lease.tenant_id == "team/rl-sampler"
            assert n1.holders() == {"GPU-n1": "team/rl-trainer"}
            assert n2.holders() == {"GPU-n2": "team/rl-sampler"}
            assert arbiter.held["team/rl"].joined == {"team/rl-sampler"}
            release(n2.service, sampler, lease)  # its only pod leaves: the turn ends
            granted = await acquire(n1.service, pod(n1, "sft-a"))  # and other jobs go on
            assert granted.tenant_id == "team/sft-a"

    run(body)


def test_a_member_whose_deadline_passes_hears_which_job_holds_its_gpus(tmp_path: Path) -> None:
    async def body() -> None:
        async with cluster(tmp_path) as (n1, n2, _arbiter):
            await acquire(n1.service, pod(n1, "sft-a"))
            request = pb.AcquireRequest(timeout_ms=1000)
            with pytest.raises(AcquireTimeout) as late:
                await api_ops.acquire(n2.service, pod(n2, "rl-sampler"), request)
            assert str(late.value) == (
                "job team/rl: no turn before the deadline; its GPUs were held by job team/sft"
            )

    run(body)


def test_a_member_whose_gpus_another_namespaces_job_holds_hears_only_that(tmp_path: Path) -> None:
    async def body() -> None:
        jobs = {**JOBS, "eval": [("other/eval-a", "n2", "")]}
        async with cluster(tmp_path, jobs) as (_n1, n2, _arbiter):
            await acquire(n2.service, n2.service.tenants.tenants["other/eval-a"])
            request = pb.AcquireRequest(timeout_ms=1000)
            with pytest.raises(AcquireTimeout) as late:
                await api_ops.acquire(n2.service, pod(n2, "rl-sampler"), request)
            assert str(late.value) == (
                "job team/rl: no turn before the deadline; its GPUs were held by a job of "
                "another namespace"
            )

    run(body)


def test_a_coordinator_that_never_answers_ends_a_members_acquire_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(coordinated, "UNAVAILABLE_S", 0.5)

    async def body() -> None:
        async with cluster(tmp_path) as (n1, _n2, _arbiter):
            with socket.socket() as closed:  # a port nobody listens on
                closed.bind(("127.0.0.1", 0))
                address = f"127.0.0.1:{closed.getsockname()[1]}"
            gate = CoordinatedTurns(n1.turns, address, TOKEN)
            n1.service.jobs = gate
            trainer = pod(n1, "rl-trainer")
            try:
                forever = pb.AcquireRequest(job="rl")  # no timeout of its own
                with pytest.raises(JobTurnRefused, match=f"coordinator at {address} has been "):
                    await asyncio.wait_for(api_ops.acquire(n1.service, trainer, forever), 10)
                with pytest.raises(AcquireTimeout, match=f"the coordinator at {address}: "):
                    await api_ops.acquire(n1.service, trainer, pb.AcquireRequest(timeout_ms=300))
            finally:
                await gate.close()

    run(body)


def test_a_member_that_waited_long_for_its_turn_waits_out_an_election_all_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound on a coordinator that does not serve counts from its first UNAVAILABLE, not
    from the acquire: time spent in the queue is not time the coordinator was away."""
    monkeypatch.setattr(coordinated, "UNAVAILABLE_S", 1.0)

    async def body() -> None:
        async with cluster(tmp_path) as (n1, _n2, arbiter):
            await acquire(n1.service, pod(n1, "sft-a"))  # holds GPU-n1: the rl job waits
            joins = asyncio.Queue[None]()
            join = arbiter.join

            async def joining(ns: str, job: str, group: str, pod: str, t: float | None) -> JobTurn:
                joins.put_nowait(None)
                return await join(ns, job, group, pod, t)

            arbiter.join = joining  # type: ignore[method-assign,assignment]
            theirs = asyncio.create_task(acquire(n1.service, pod(n1, "rl-trainer")))
            await asyncio.wait_for(joins.get(), 5)
            asked = asyncio.get_running_loop().time()
            while asyncio.get_running_loop().time() - asked < 1.5 * coordinated.UNAVAILABLE_S:
                await asyncio.sleep(0.05)  # the rl job waits in the queue longer than the bound
            assert not theirs.done()
            arbiter.step_down("the Lease was lost")  # the waiter hears UNAVAILABLE
            table = arbiter.new_table()  # and leads again at once, as a new leader would
            found = await recover(arbiter.view, arbiter.links, table, 2)
            arbiter.lead(2, table, found)
            again = asyncio.ensure_future(joins.get())  # the agent asks the new leader again
            await asyncio.wait({again, theirs}, timeout=5, return_when=asyncio.FIRST_COMPLETED)
            if not again.done():
                again.cancel()
                raise AssertionError(theirs.exception() if theirs.done() else "not asked again")
            await arbiter.yield_("team", "sft", "")
            lease = await theirs
            assert lease.tenant_id == "team/rl-trainer"

    run(body)


def test_a_member_the_maximum_hold_revoked_and_gave_back_yields_its_jobs_turn(
    tmp_path: Path,
) -> None:
    """A node-local pod waits on the trainer's GPU: the maximum hold revokes the trainer's turn
    and gives it back later under a new lease. The job's turn follows it there: the trainer asks
    again and joins at once, and its yield of the new lease leaves the job's turn."""

    async def body() -> None:
        async with cluster(tmp_path) as (n1, n2, arbiter):
            trainer = pod(n1, "rl-trainer")
            solo = n1.add_pod("team/solo", ("GPU-n1",))  # no job: a node-local tenant
            n1.service.table.max_hold = 0.2
            first = await acquire(n1.service, trainer)
            n1.service.table.max_hold = 60.0  # the trainer's turn alone runs out
            local = await acquire(n1.service, solo)  # once the trainer's turn is revoked
            release(n1.service, solo, local)  # the trainer's turn is given back
            held = n1.service.table.leases_of(trainer.tenant_id)
            assert [lease.lease_id != first.lease_id for lease in held] == [True]
            again = await api_ops.acquire(
                n1.service, trainer, pb.AcquireRequest(timeout_ms=1000)
            )  # it computes in its job's turn: joined at once
            assert again.lease_id == held[0].lease_id
            release(n1.service, trainer, again)
            await until(lambda: not arbiter.held and not n2.holders(), "the job's turn ends")
            assert n1.holders() == {}

    run(body)


def test_a_member_yielding_while_its_revoked_turn_waits_to_be_given_back_leaves_its_jobs_turn(
    tmp_path: Path,
) -> None:
    """The client knows no lease while its revoked turn waits to come back: its yield names
    none. That yield leaves the job's turn all the same, and the turn's resume goes with it."""

    async def body() -> None:
        async with cluster(tmp_path) as (n1, n2, arbiter):
            trainer = pod(n1, "rl-trainer")
            solo = n1.add_pod("team/solo", ("GPU-n1",))  # no job: a node-local tenant
            n1.service.table.max_hold = 0.2
            await acquire(n1.service, trainer)
            n1.service.table.max_hold = 60.0  # the trainer's turn alone runs out
            local = await acquire(n1.service, solo)  # once the trainer's turn is revoked
            api_ops.release(n1.service, trainer, pb.YieldRequest())  # while it waits to resume
            await until(lambda: not arbiter.held and not n2.holders(), "the job's turn ends")
            assert not n1.service.table.waiters  # the trainer's resume went with its turn
            release(n1.service, solo, local)
            assert n1.holders() == {}

    run(body)


def test_a_member_asking_while_its_revoked_turn_waits_to_be_given_back_hears_so(
    tmp_path: Path,
) -> None:
    """The job's turn still holds; only the node has not given the trainer its GPU back yet:
    its acquire's deadline says so (and who holds the GPU), not that the turn ended."""

    async def body() -> None:
        async with cluster(tmp_path) as (n1, _n2, arbiter):
            trainer = pod(n1, "rl-trainer")
            solo = n1.add_pod("team/solo", ("GPU-n1",))  # no job: a node-local tenant
            n1.service.table.max_hold = 0.2
            await acquire(n1.service, trainer)
            n1.service.table.max_hold = 60.0  # the trainer's turn alone runs out
            local = await acquire(n1.service, solo)  # once the trainer's turn is revoked
            with pytest.raises(AcquireTimeout) as late:
                await api_ops.acquire(n1.service, trainer, pb.AcquireRequest(timeout_ms=500))
            turn = arbiter.held["team/rl"].turn_id
            assert str(late.value).startswith(
                f"job team/rl: its turn {turn} holds, but node n1 revoked pod team/rl-trainer's "
                "lease in it and had not given its GPUs back by the deadline: position 1 "
                "(GPU-n1 behind holder team/solo)"
            )
            theirs = asyncio.create_task(acquire(n1.service, trainer))
            release(n1.service, solo, local)  # the trainer's turn is given back: it joins it
            lease = await theirs
            assert lease.lease_id == n1.service.table.leases_of(trainer.tenant_id)[0].lease_id

    run(body)


def test_a_nodes_report_carries_the_token_of_the_lease_that_gave_a_revoked_member_its_turn_back(
    tmp_path: Path,
) -> None:
    """The maximum hold revokes the trainer's turn for a node-local pod and gives it back under
    a new lease, with a newer fencing token: the node's report of the job's turn carries that
    one, the token the trainer computes under, not the one it was prepared with."""

    async def body() -> None:
        async with cluster(tmp_path) as (n1, _n2, arbiter):
            trainer = pod(n1, "rl-trainer")
            solo = n1.add_pod("team/solo", ("GPU-n1",))  # no job: a node-local tenant
            n1.service.table.max_hold = 0.2
            first = await acquire(n1.service, trainer)
            n1.service.table.max_hold = 60.0  # the trainer's turn alone runs out
            release(n1.service, solo, await acquire(n1.service, solo))  # revoked, given back
            [resumed] = n1.service.table.leases_of(trainer.tenant_id)
            assert resumed.tokens["GPU-n1"] > first.fencing_tokens["GPU-n1"]
            [turn] = (await arbiter.links.report("n1", n1.address, 1)).turns
            assert list(turn.fencing_tokens) == [resumed.tokens["GPU-n1"]]

    run(body)
