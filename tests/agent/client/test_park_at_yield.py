"""A holder whose own process moves its memory parks it as it yields, on the yielding thread,
when the agent says the tenant due next needs the room (`ParkAtYield`): the yield names what it
parked, and the next grant asks for no park. A hint withdrawn is not acted on; a park at the
yield that fails is left to the agent's callback."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from agent.client import AsyncBaton, Baton, LeaseInfo
from agent.client.errors import AcquireTimeout, BatonError
from agent.parking.setup import ParkingOptions
from baton._pb import agent_pb2 as pb
from baton.contract.names import MIB
from tests.agent.client.test_client_close import GPU, WAIT_S
from tests.agent.client.test_restore_with_grant import (
    Pair,
    Recorded,
    sample,
    taking,
    two_tenants,
)
from tests.harness.agent import AgentRunner
from tests.harness.pushes import Pushes

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def app_agent(workdir: str) -> Iterator[AgentRunner]:
    """An agent whose 100 MiB GPU holds one 60 MiB tenant at a time, first come first served:
    under the fair policy a holder owed more than the one waiting may keep the GPU at its yield,
    and is then (rightly) told to park nothing, as timing decides."""
    with AgentRunner(
        workdir, queue_policy="fifo", parking=ParkingOptions(backend="app", fake_gpus="1x100")
    ) as runner:
        yield runner


def hints_of(client: Baton | AsyncBaton) -> Pushes[tuple[str, ...]]:
    """The GPUs of each `ParkAtYield` a client's session core takes in, as they arrive."""
    return Pushes(client, "park_at_yield", lambda m: tuple(m.park_at_yield.gpus))


@pytest.fixture
def pair(app_agent: AgentRunner) -> Iterator[Pair]:
    """`two_tenants`, parking as they yield when told to."""
    yield from two_tenants(app_agent, park_at_yield=True)


def handover(agent: AgentRunner, clients: dict[str, Baton], leaving: str, coming: str) -> None:
    """`leaving` holds, `coming` queues, `leaving` is told to park as it yields, and yields."""
    holder, hints = clients[leaving], hints_of(clients[leaving])
    holder.acquire(WAIT_S)
    taker = taking(agent, clients[coming], lambda: clients[coming].acquire(WAIT_S))
    hints.wait((GPU,))
    holder.yield_()
    taker.join(WAIT_S)
    assert not taker.is_alive(), f"{coming} was never granted"


def parked(agent: AgentRunner, client: Baton | AsyncBaton) -> int:
    assert client.tenant is not None
    entry = agent.status()["residency"]["tenants"][client.tenant.tenant_id]
    return int(entry["parked_bytes"]) if entry["residency"] == "parked" else 0


def test_the_holder_parks_itself_on_its_yielding_thread_and_the_grant_asks_no_park(
    pair: Pair,
) -> None:
    agent, recorded, clients = pair
    handover(agent, clients, "a", "b")
    assert recorded["a"].calls == [("park", "MainThread")]  # before its yield left
    assert parked(agent, clients["a"]) == 60 * MIB
    assert sample(agent, "baton_moved_bytes_by_stage_total", direction="park", stage="yielded") == (
        60 * MIB
    )
    assert sample(agent, "baton_move_seconds_count", direction="park") == 0  # no callback park
    handover(agent, clients, "b", "a")  # b parks itself; a restores itself with its grant
    assert recorded["b"].calls == [("park", "MainThread")]
    assert recorded["a"].calls == [("park", "MainThread"), ("restore", "taker")]
    assert clients["a"].lease is not None and parked(agent, clients["b"]) == 60 * MIB
    assert sample(agent, "baton_moves_total", direction="park") == 2
    assert [t.action for t in clients["a"].callback_timings] == ["park", "restore"]


def test_a_hint_withdrawn_before_the_yield_parks_nothing(pair: Pair) -> None:
    agent, recorded, clients = pair
    holder, hints = clients["a"], hints_of(clients["a"])
    holder.acquire(WAIT_S)
    waiter = clients["b"]
    timed_out: list[AcquireTimeout] = []

    def give_up() -> None:
        try:
            waiter.acquire(0.5)
        except AcquireTimeout as exc:
            timed_out.append(exc)

    gave_up = taking(agent, waiter, give_up)
    hints.wait((GPU,))
    gave_up.join(WAIT_S)  # b's acquire timed out: nobody is due next any more
    assert timed_out
    hints.wait((), latest=True)
    holder.yield_()
    assert recorded["a"].calls == [] and parked(agent, holder) == 0


def test_a_park_at_the_yield_that_fails_is_left_to_the_agents_callback(pair: Pair) -> None:
    agent, recorded, clients = pair
    attempts: list[str] = []
    park = recorded["a"].park

    def fails_once(gpu: str) -> int:
        attempts.append(threading.current_thread().name)
        if len(attempts) == 1:
            raise RuntimeError("offload failed")
        return park(gpu)

    clients["a"]._callbacks["park"] = fails_once
    handover(agent, clients, "a", "b")
    assert attempts == ["MainThread", "baton-client"]  # the yield's, then the agent's callback
    assert parked(agent, clients["a"]) == 60 * MIB
    assert sample(agent, "baton_move_seconds_count", direction="park") == 1


def test_the_async_client_parks_itself_as_it_yields(app_agent: AgentRunner) -> None:
    recorded = {name: Recorded() for name in ("x", "y")}

    def client(name: str) -> AsyncBaton:
        r = recorded[name]
        return AsyncBaton(
            app_agent.socket, [GPU], name=name, gpu_memory_mib=60,
            on_park=r.park, on_restore=r.restore,
        )  # fmt: skip

    async def scenario() -> None:
        async with client("x") as x, client("y") as y:
            await y.acquire(WAIT_S)  # parks x by callback (nobody held a turn to park at)
            await y.yield_()
            hints = hints_of(x)
            await x.acquire(WAIT_S)  # x restores itself with its grant
            queued = asyncio.create_task(y.acquire(WAIT_S))
            await asyncio.to_thread(hints.wait, (GPU,))
            await x.yield_()
            await asyncio.wait_for(queued, WAIT_S)
            assert y.lease is not None
            assert parked(app_agent, x) == 60 * MIB and x.parked.bytes == {GPU: 60 * MIB}

    asyncio.run(scenario())
    assert [c for c, _ in recorded["x"].calls] == ["park", "restore", "park"]
    # By callback: x for y's first grant, y for x's (nobody waited as y yielded); not x's last.
    assert sample(app_agent, "baton_move_seconds_count", direction="park") == 2
    stage = {"direction": "park", "stage": "yielded"}
    assert sample(app_agent, "baton_moved_bytes_by_stage_total", **stage) == 60 * MIB


def test_parked_memory_named_with_a_turn_the_tenant_does_not_hold_is_not_counted(
    pair: Pair,
) -> None:
    agent, _, clients = pair
    holder = clients["a"]
    lease = holder.acquire(WAIT_S)
    stale = pb.YieldRequest(lease_id="not-a-lease", parked={GPU: 60 * MIB})
    with pytest.raises(BatonError, match="not-a-lease"):
        holder._request(pb.Request(release=stale))
    assert parked(agent, holder) == 0 and holder.lease == lease
    other = pb.YieldRequest(lease_id=lease.lease_id, parked={"GPU-not-its-own": 60 * MIB})
    holder._request(pb.Request(release=other))  # ends the turn; the foreign GPU is ignored
    assert parked(agent, holder) == 0


def test_a_ctrl_c_in_the_park_at_the_yield_still_gives_the_turn_back(pair: Pair) -> None:
    agent, recorded, clients = pair
    holder, hints = clients["a"], hints_of(clients["a"])
    attempts: list[str] = []
    park = recorded["a"].park

    def interrupted_once(gpu: str) -> int:
        attempts.append(threading.current_thread().name)
        if len(attempts) == 1:
            raise KeyboardInterrupt
        return park(gpu)

    holder._callbacks["park"] = interrupted_once
    holder.acquire(WAIT_S)
    taker = taking(agent, clients["b"], lambda: clients["b"].acquire(WAIT_S))
    hints.wait((GPU,))
    with pytest.raises(KeyboardInterrupt):
        holder.yield_()
    assert holder.lease is None  # the interrupt leaves no turn held
    taker.join(WAIT_S)
    assert not taker.is_alive(), "b was never granted: a's turn stayed held after the Ctrl-C"
    assert attempts == ["MainThread", "baton-client"]  # the yield's, then the agent's callback
    assert parked(agent, holder) == 60 * MIB


class SlowPark:
    """Tenants `x` and `y` of `agent`, `x`'s on_park held until `release` (`parking` set as it
    begins): a yield to cancel in its park."""

    def __init__(self, agent: AgentRunner) -> None:
        self.agent = agent
        self.recorded = {name: Recorded() for name in ("x", "y")}
        self.parking, self.release = threading.Event(), threading.Event()

    def _slow_park(self, gpu: str) -> int:
        self.parking.set()
        assert self.release.wait(WAIT_S), "the test never let the park finish"
        return self.recorded["x"].park(gpu)

    async def cancel_in_park(
        self, x: AsyncBaton, y: AsyncBaton
    ) -> tuple[LeaseInfo, asyncio.Task[LeaseInfo]]:
        """`x` takes the turn, `y` queues for it, and `x`'s yield is cancelled in its park:
        `x`'s lease and `y`'s acquire, still waiting."""
        first = await x.acquire(WAIT_S)
        hints = hints_of(x)
        queued = asyncio.create_task(y.acquire(WAIT_S))
        await asyncio.to_thread(hints.wait, (GPU,))
        yielding = asyncio.create_task(x.yield_())
        await asyncio.to_thread(self.parking.wait, WAIT_S)
        yielding.cancel()
        with pytest.raises(asyncio.CancelledError):
            await yielding
        return first, queued

    def client(self, name: str) -> AsyncBaton:
        r = self.recorded[name]
        on_park = self._slow_park if name == "x" else r.park
        return AsyncBaton(
            self.agent.socket, [GPU], name=name, gpu_memory_mib=60,
            on_park=on_park, on_restore=r.restore,
        )  # fmt: skip


def test_an_async_yield_cancelled_in_its_park_gives_the_turn_back_once_parked(
    app_agent: AgentRunner,
) -> None:
    """The park goes on in its thread after the cancel; the yield follows it, naming it."""
    slow = SlowPark(app_agent)
    recorded, release, client = slow.recorded, slow.release, slow.client

    async def scenario() -> None:
        async with client("x") as x, client("y") as y:
            _, queued = await slow.cancel_in_park(x, y)
            assert not queued.done()  # its memory is still on the GPU: not granted yet
            release.set()
            await asyncio.wait_for(queued, WAIT_S)
            assert y.lease is not None and x.lease is None
            assert parked(app_agent, x) == 60 * MIB and x.parked.bytes == {GPU: 60 * MIB}

    asyncio.run(scenario())
    assert [c for c, _ in recorded["x"].calls] == ["park"]  # the yield's, not a callback's


def test_an_acquire_after_a_yield_cancelled_in_its_park_waits_for_a_turn_of_its_own(
    app_agent: AgentRunner,
) -> None:
    """The turn the cancelled yield still ends as its park finishes is not handed to an acquire
    made meanwhile (a task group's retry, the next step of the loop): that one queues."""
    slow = SlowPark(app_agent)
    release, client = slow.release, slow.client

    async def scenario() -> None:
        async with client("x") as x, client("y") as y:
            first, queued = await slow.cancel_in_park(x, y)
            again = asyncio.create_task(x.acquire(WAIT_S))
            release.set()
            await asyncio.wait_for(queued, WAIT_S)
            assert not again.done(), "x was handed the turn its cancelled yield ended"
            await y.yield_()
            assert (await asyncio.wait_for(again, WAIT_S)).lease_id != first.lease_id
            await x.yield_()

    asyncio.run(scenario())


def test_an_acquire_waiting_for_a_cancelled_yields_park_ends_by_its_own_timeout(
    app_agent: AgentRunner,
) -> None:
    """The park the cancelled yield waits for is the user's on_park, as long as it takes: an
    acquire made meanwhile with a timeout still ends by it, saying why it waited."""
    slow = SlowPark(app_agent)
    release = slow.release

    async def scenario() -> None:
        async with slow.client("x") as x, slow.client("y") as y:
            _, queued = await slow.cancel_in_park(x, y)
            started = asyncio.get_running_loop().time()
            with pytest.raises(AcquireTimeout, match="waited for that park") as late:
                await asyncio.wait_for(x.acquire(timeout=0.2), WAIT_S)
            assert asyncio.get_running_loop().time() - started < 5
            assert "on_park" in late.value.reason
            release.set()
            await asyncio.wait_for(queued, WAIT_S)  # the turn went on once the park was done
            await y.yield_()

    try:
        asyncio.run(scenario())
    finally:
        release.set()


def test_the_hint_goes_only_to_the_process_that_parks_the_tenant(app_agent: AgentRunner) -> None:
    """Two processes of tenant `a`: one offers on_park/on_restore, the other (which holds the
    turn) none. Only the first hears the hint; the other yields without trying to park, and
    the agent parks `a` by callback as before."""
    recorded = {name: Recorded() for name in ("a", "b")}

    def parker(name: str) -> Baton:
        r = recorded[name]
        return Baton(
            app_agent.socket, [GPU], name=name, gpu_memory_mib=60,
            on_park=r.park, on_restore=r.restore,
        )  # fmt: skip

    plain = Baton(app_agent.socket, [GPU], name="a")  # no callbacks
    with parker("a") as a_parks, plain as a_plain, parker("b") as b:
        a_parks.connect()
        a_plain.connect()
        parks_hints, plain_hints = hints_of(a_parks), hints_of(a_plain)
        a_plain.acquire(WAIT_S)
        taker = taking(app_agent, b, lambda: b.acquire(WAIT_S))
        parks_hints.wait((GPU,))
        a_plain.yield_()  # its stream's answer comes after any hint queued before it
        taker.join(WAIT_S)
        assert not taker.is_alive(), "b was never granted"
        assert plain_hints.seen == []
        assert recorded["a"].calls == [("park", "baton-client")]  # by the agent's callback
        assert parked(app_agent, a_parks) == 60 * MIB
