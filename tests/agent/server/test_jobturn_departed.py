"""A job's turn prepared for a member pod whose last session just ended, while the agent still
forgets what it kept of that process (its forget waits for the parking lock behind a move): the
turn starts from what is left once it is forgotten, not from the departed process's residency."""

from __future__ import annotations

import inspect
import time
from typing import Any

import pytest

from agent.node.jobturn_store import JobTurnStore
from agent.node.tenants import POD, Tenant
from agent.parking.backends.fakegpu import FakeGpuMemory
from agent.server import jobturns_link
from agent.server.jobturns import JobTurns
from agent.server.sessions import Session
from baton._pb import jobturns_pb2 as jt
from baton.contract.names import LABEL_JOB, fake_gpu_uuid
from tests.agent.server.test_jobturn_prepare import Answers
from tests.agent.server.test_jobturns_link import until
from tests.harness.agent import AgentRunner, one_small_fake_gpu

GPU = fake_gpu_uuid(0)
WAIT_S = 10.0
pytestmark = pytest.mark.timeout(60)


def pod(name: str, labels: dict[str, str] | None = None) -> Tenant:
    return Tenant(f"team/{name}", name, (GPU,), gpu_memory_mib=60, source=POD, labels=labels or {})


def turn(agent: AgentRunner, tenant: Tenant, fake_dir: str) -> None:
    """The pod takes a turn, allocates its 60 MiB in it and yields."""
    granted = agent.call(agent.service.acquire(tenant, [GPU], WAIT_S))
    FakeGpuMemory(tenant.tenant_id, fake_dir).allocate(GPU, 60)
    agent.inspect(lambda s: s.yield_(tenant, granted.lease.lease_id))


@pytest.mark.parametrize("pod_leaves", [False, True])
def test_a_turn_prepared_while_a_members_departed_process_is_forgotten_is_not_restored(
    workdir: str, pod_leaves: bool
) -> None:
    """The trainer (parked for b) ends its last session while a move holds the parking lock;
    the coordinator prepares the job's turn then. The forget drops the parked memory, so the
    turn restores nothing: the coordinator must not hear "restored" (llm-d's
    context_restored), as it did when the preparation read the departed process's residency
    before the forget ran. A pod that leaves the node meanwhile still fails the prepare, naming
    it, rather than taking a turn for nobody."""
    parking = one_small_fake_gpu(workdir)
    fake_dir = parking.fake_dir
    agent = AgentRunner(workdir, parking=parking).start()
    trainer, b = pod("trainer", {LABEL_JOB: "rl"}), pod("b")
    prep = agent.service.preparer
    lock = prep._lock  # type: ignore[attr-defined]
    held = False
    turns: Any = None
    try:
        agent.inspect(lambda s: s.upsert_pod(trainer))
        agent.inspect(lambda s: s.upsert_pod(b))
        turn(agent, trainer, fake_dir)
        turn(agent, b, fake_dir)  # the trainer is parked for b
        assert agent.moves("park") == 1
        turns = agent.inspect(
            lambda s: JobTurns(s, "n1", JobTurnStore(f"{workdir}/turns"), time.time)
        )
        session = Session(trainer.tenant_id, 41, "token")
        agent.inspect(lambda s: s.sessions.open(session))
        agent.call(lock.acquire())  # a move of another tenant runs: the forget waits for it
        held = True
        agent.inspect(lambda s: s.session_closed(trainer.tenant_id, 41, s.sessions.close(session)))
        agent.wait_queued_on(lock, "the departed trainer's forget to wait for the lock", WAIT_S)
        out = Answers()
        link = jobturns_link._Connection(turns, out)  # type: ignore[arg-type]
        prepare = jt.PrepareRequest(epoch=1, turn_id="t1", namespace="team", job="rl")

        async def prepare_then_release() -> None:
            nonlocal held
            link.handle(jt.JobTurnsCall(id=1, prepare=prepare))

            def under_way() -> bool:
                p = turns._preparing.get("t1")
                return p is not None and inspect.getcoroutinestate(p.task.get_coro()) == (
                    inspect.CORO_SUSPENDED
                )

            await until(under_way)  # the preparation has started (and waits)
            if pod_leaves:
                agent.service.pod_gone(trainer.tenant_id)
            lock.release()
            held = False
            await until(lambda: bool(out.got))
            await link.close()

        agent.call(prepare_then_release(), WAIT_S)
        if pod_leaves:
            assert out.kinds() == [(1, "refused")], out.got
            assert out.got[0].refused.code == "ABORTED"
            details = out.got[0].refused.details
            assert "pod team/trainer" in details and "left" in details, details
            assert not agent.inspect(lambda s: s.table.leases or s.table.waiters)
            return
        assert out.kinds() == [(1, "turn")], out.got
        assert list(out.got[0].turn.members) == [trainer.tenant_id]
        assert agent.moves("restore") == 0, "the forget dropped the parked memory"
        assert not out.got[0].turn.restored, "told restored: nothing was"
    finally:
        if held:
            agent.inspect(lambda s: lock.release())
        if turns is not None:
            agent.inspect(lambda s: turns.close())
        agent.stop()
