"""The coordinator's connection to an agent's job turns: frames on TCP, the token first, answers
by id in any order, a call given up cancelled on the agent (`agent.server.jobturns_link`, spoken
by `coordinator.agents.AgentLinks` and by hand)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

from agent.server import jobturns_link
from agent.server.jobturns import JobTurns
from agent.server.jobturns_link import JobTurnServer
from agent.server.service import LeaseService
from baton._pb import jobturns_pb2 as jt
from baton.contract import framing
from baton.contract.names import LABEL_JOB
from coordinator import agents
from coordinator.agents import AgentLinks, NodeFailed
from tests.agent.server.test_jobturns import TOKEN, node, pod, run

Body = Callable[[LeaseService, JobTurns, str], Awaitable[None]]


@asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[tuple[LeaseService, JobTurns, str]]:
    """An agent's job turns served on loopback; yields (service, turns, address)."""
    service, turns = node(tmp_path)
    server = JobTurnServer(turns, "127.0.0.1:0", TOKEN)
    port = await server.start()
    try:
        yield service, turns, f"127.0.0.1:{port}"
    finally:
        await server.stop(0)
        await service.close()


def holders(service: LeaseService) -> set[str]:
    return {lease.tenant_id for lease in service.table.leases.values()}


async def until(check: Callable[[], bool]) -> None:
    """Wait (yielding to the loop, bounded by `run`'s deadline) until `check()` holds."""
    while not check():
        await asyncio.sleep(0.001)


def test_calls_with_the_token_prepare_report_and_an_older_epoch_is_refused(tmp_path: Path) -> None:
    async def body() -> None:
        async with serving(tmp_path) as (_, _, address):
            links = AgentLinks(TOKEN)
            turn = await links.prepare("n1", address, 2, ("t1", "team", "rl", ""), (), 5)
            assert list(turn.members) == ["team/sampler", "team/trainer"]
            report = await links.report("n1", address, 2)
            assert (report.node, report.epoch, len(report.turns)) == ("n1", 2, 1)
            with pytest.raises(NodeFailed) as stale:
                await links.commit("n1", address, 1, "t1")
            assert stale.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "older than epoch 2" in stale.value.why
            with pytest.raises(NodeFailed) as unknown:
                await links.commit("n1", address, 2, "no-such-turn")
            assert unknown.value.code == grpc.StatusCode.NOT_FOUND
            assert (await links.commit("n1", address, 2, "t1")).state == "committed"
            await links.close()

    run(body)


def test_a_release_is_answered_while_a_prepare_on_the_same_connection_waits(
    tmp_path: Path,
) -> None:
    """Answers by id, in any order: the next job's prepare waits for the GPU, and the release
    of the job holding it, sent behind it on the one connection, is what frees it."""

    async def body() -> None:
        async with serving(tmp_path) as (service, _, address):
            service.upsert_pod(pod("eval", ("GPU-0",), {LABEL_JOB: "ev"}))
            links = AgentLinks(TOKEN)
            await links.prepare("n1", address, 1, ("t1", "team", "rl", ""), (), 5)
            waiting = asyncio.create_task(
                links.prepare("n1", address, 1, ("t2", "team", "ev", ""), (), 5)
            )
            await until(lambda: bool(service.table.waiters))  # t2 waits on this connection
            assert await links.release("n1", address, 1, "t1", "yielded")
            assert list((await waiting).members) == ["team/eval"]
            await links.close()

    run(body)


def test_a_prepare_its_release_overtakes_is_answered_aborted(tmp_path: Path) -> None:
    async def body() -> None:
        async with serving(tmp_path) as (service, _, address):
            other = service.tenants.tenants["team/other"]
            await service.acquire(other, ("GPU-1",), timeout=5)  # the sampler must wait
            links = AgentLinks(TOKEN)
            preparing = asyncio.create_task(
                links.prepare("n1", address, 1, ("t1", "team", "rl", ""), (), 30)
            )
            await until(lambda: "team/trainer" in holders(service))
            assert await links.release("n1", address, 1, "t1", "rolled back")
            with pytest.raises(NodeFailed) as aborted:
                await preparing  # at once, not at its deadline
            assert aborted.value.code == grpc.StatusCode.ABORTED
            assert "turn t1 was released while being prepared" in aborted.value.why
            assert holders(service) == {"team/other"} and not service.table.waiters
            await links.close()

    run(body)


def test_a_prepare_given_up_by_its_deadline_is_cancelled_on_the_agent(tmp_path: Path) -> None:
    async def body() -> None:
        async with serving(tmp_path) as (service, _, address):
            other = service.tenants.tenants["team/other"]
            await service.acquire(other, ("GPU-1",), timeout=5)  # the sampler must wait
            links = AgentLinks(TOKEN, call_timeout_s=0.2)
            with pytest.raises(NodeFailed) as late:
                await links.prepare("n1", address, 1, ("t1", "team", "rl", ""), (), 0)
            assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "did not answer in time" in late.value.why
            # The cancel frame reached the agent: the trainer's grant is given back, the
            # sampler leaves the queue.
            await until(lambda: holders(service) == {"team/other"} and not service.table.waiters)
            await links.close()

    run(body)


def test_the_connections_end_gives_up_a_prepare_still_waiting(tmp_path: Path) -> None:
    async def body() -> None:
        async with serving(tmp_path) as (service, _, address):
            other = service.tenants.tenants["team/other"]
            await service.acquire(other, ("GPU-1",), timeout=5)
            links = AgentLinks(TOKEN)
            preparing = asyncio.create_task(
                links.prepare("n1", address, 1, ("t1", "team", "rl", ""), (), 5)
            )
            await until(lambda: "team/trainer" in holders(service))
            await links.close()  # the coordinator goes away
            with pytest.raises(NodeFailed) as lost:
                await preparing
            assert lost.value.code == grpc.StatusCode.UNAVAILABLE
            await until(lambda: holders(service) == {"team/other"} and not service.table.waiters)

    run(body)


def test_an_agent_not_listening_is_unavailable_and_a_later_call_connects_again(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        links = AgentLinks(TOKEN)
        async with serving(tmp_path) as (_, _, address):
            assert (await links.report("n1", address, 1)).node == "n1"
        with pytest.raises(NodeFailed) as gone:  # that agent stopped: its connection ended
            await links.report("n1", address, 1)
        assert gone.value.code == grpc.StatusCode.UNAVAILABLE
        assert "unreachable" in gone.value.why
        async with serving(tmp_path / "again") as (_, _, again):
            assert (await links.report("n1", again, 1)).epoch == 1
        await links.close()

    run(body)


def test_both_ends_probe_a_quiet_connection_and_give_up_on_unacknowledged_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer whose machine vanished (no FIN, no RST) ends the connection within seconds rather
    than TCP's quarter of an hour, so calls fail and the next one connects again."""
    ends: list[socket.socket] = []

    def recorded(writer: asyncio.StreamWriter) -> None:
        framing.keep_alive(writer)
        ends.append(writer.get_extra_info("socket"))

    monkeypatch.setattr(jobturns_link, "keep_alive", recorded)
    monkeypatch.setattr(agents, "keep_alive", recorded)

    async def body() -> None:
        async with serving(tmp_path) as (_, _, address):
            links = AgentLinks(TOKEN)
            await links.report("n1", address, 1)
            assert len(ends) == 2  # the coordinator's end and the agent's
            for sock in ends:
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 20_000
            await links.close()

    run(body)


def test_stopping_with_a_coordinator_connected_or_a_peer_gone_logs_no_traceback(
    tmp_path: Path,
) -> None:
    """Both coordinator replicas keep their connections open, so every agent stop ends some;
    keepalive ends the connection of a peer that vanished. Neither is a traceback."""

    async def body() -> None:
        errors: list[dict[str, object]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: errors.append(ctx))
        async with serving(tmp_path) as (_, _, address):
            dead, alive = AgentLinks(TOKEN), AgentLinks(TOKEN)
            await dead.report("n1", address, 1)
            await alive.report("n1", address, 1)
            agent_end = [t for t in asyncio.all_tasks() if "_serve" in repr(t.get_coro())]
            assert len(agent_end) == 2
            # The first link's connection is cut (reset), as a vanished peer's ends.
            transport = dead._links[address].result()._writer.transport
            transport.abort()
            with pytest.raises(NodeFailed):
                await dead.report("n1", address, 1)  # and the next call connects again...
            assert (await dead.report("n1", address, 1)).node == "n1"
        # ...and the agent stopped with both connected.
        await dead.close()
        await alive.close()
        assert errors == []

    run(body)


def test_an_address_that_accepts_and_never_says_hello_is_unavailable_and_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agents, "CONNECT_TIMEOUT_S", 0.3)

    async def body() -> None:
        accepted: list[asyncio.StreamWriter] = []

        async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        links = AgentLinks(TOKEN)
        for attempt in (1, 2):
            with pytest.raises(NodeFailed) as silent_agent:
                await links.report("n1", address, 1)
            assert silent_agent.value.code == grpc.StatusCode.UNAVAILABLE
            assert "no hello from" in silent_agent.value.why
            assert len(accepted) == attempt  # each call tried a new connection
        await links.close()
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()

    run(body)


@pytest.mark.parametrize("cancelled_first", [False, True])
def test_a_release_that_ends_a_preparation_is_answered_once_nothing_of_it_is_held(
    tmp_path: Path, cancelled_first: bool
) -> None:
    """The coordinator hears "released" only when the node holds nothing of the turn: the
    preparation it cancelled has given the member granted already its turn back and taken the
    waiting one out of the queue, so a job told of the roll-back finds nothing held here. What
    the node holds is read as each answer is written. `cancelled_first`: the coordinator's own
    order when another node fails, the prepare call cancelled and the release a step later, in
    the middle of the preparation's clean-up (which a second cancel must not cut short)."""

    async def body() -> None:
        service, turns = node(tmp_path)
        written: list[tuple[jt.JobTurnsAnswer, set[str], int]] = []

        class Writer:
            def write(self, data: bytes) -> None:
                while data:
                    (size,) = framing.HEADER.unpack_from(data)
                    body = data[framing.HEADER.size : framing.HEADER.size + size]
                    data = data[framing.HEADER.size + size :]
                    answer = framing.decode(jt.JobTurnsAnswer, body)
                    written.append((answer, holders(service), len(service.table.waiters)))

            def is_closing(self) -> bool:
                return False

        try:
            other = service.tenants.tenants["team/other"]
            await service.acquire(other, ("GPU-1",), timeout=5)  # the sampler must wait
            link = jobturns_link._Connection(turns, Writer())  # type: ignore[arg-type]
            prepare = jt.PrepareRequest(epoch=1, turn_id="t1", namespace="team", job="rl")
            link.handle(jt.JobTurnsCall(id=1, prepare=prepare))
            await until(lambda: "team/trainer" in holders(service) and bool(service.table.waiters))
            # A release from an older leader is refused at once; the preparation goes on.
            stale = jt.ReleaseRequest(epoch=0, turn_id="t1", reason="rolled back")
            link.handle(jt.JobTurnsCall(id=2, release=stale))
            await until(lambda: any(answer.id == 2 for answer, _, _ in written))
            assert "older than epoch 1" in written[-1][0].refused.details
            assert written[-1][1:] == ({"team/other", "team/trainer"}, 1)
            if cancelled_first:
                link.handle(jt.JobTurnsCall(id=1, cancel=jt.Cancel()))
                await asyncio.sleep(0)  # one step: the preparation is in its clean-up
                assert not turns.preparation("t1").done()  # type: ignore[union-attr]
            release = jt.ReleaseRequest(epoch=1, turn_id="t1", reason="rolled back")
            link.handle(jt.JobTurnsCall(id=3, release=release))
            await until(lambda: any(answer.id == 3 for answer, _, _ in written))
            answers = {answer.id: (answer, held, waiting) for answer, held, waiting in written}
            answer, held, waiting = answers[3]
            assert answer.released.released
            assert (held, waiting) == ({"team/other"}, 0)
            if cancelled_first:  # the cancelled call is not answered
                assert 1 not in answers
            else:
                assert "was released while being prepared" in answers[1][0].refused.details
            assert holders(service) == {"team/other"} and not service.table.waiters
            await link.close()
        finally:
            await service.close()

    run(body)
