"""The agent's park and restore calls into a tenant of several parking processes: every process
is asked in the step the move starts, so one whose session ends from then on (its process left
as the agent began to park it) answers at once instead of leaving the move, and the node's
preparer lock it holds, waiting out the callback deadline with no reason given."""

from __future__ import annotations

import asyncio

import pytest

from agent.core import eager
from agent.core.errors import CallbackFailed, TenantGone
from agent.server.sessions import Session, SessionRegistry
from baton._pb import agent_pb2 as pb

pytestmark = pytest.mark.timeout(30)

PARKS = frozenset({"park", "restore"})
DEADLINE = 30.0
"""The callback deadline: far past the waits below, which a late answer would run out."""


def _tenant(*pids: int) -> tuple[SessionRegistry, list[Session]]:
    registry = SessionRegistry()
    sessions = [Session("job", pid, f"token-{pid}", PARKS) for pid in pids]
    for session in sessions:
        registry.open(session)
    return registry, sessions


async def _answer(session: Session, moved: int) -> None:
    """The session's process runs the callback it was sent and reports `moved` bytes."""
    message = await asyncio.wait_for(session.outbox.get(), 5)
    assert message is not None
    session.resolve(pb.CallbackResult(call_id=message.callback.call_id, bytes=moved))


def test_a_process_leaving_as_its_tenants_park_starts_does_not_hold_the_park() -> None:
    async def scenario() -> int:
        registry, (staying, leaving) = _tenant(1, 2)
        # The preparer starts a park eagerly, in the step that asked for the room; the second
        # process's session ends in that same step (it exited as its turn ended).
        done, _, rest = eager.start(registry.call_tenant("job", "park", "GPU-0", DEADLINE))
        assert not done and rest is not None
        assert not registry.close(leaving)
        await _answer(staying, 7)
        return await asyncio.wait_for(rest, 5)

    assert asyncio.run(scenario()) == 7  # what the process that stayed moved


def test_every_parking_process_is_asked_and_their_bytes_are_summed() -> None:
    async def scenario() -> int:
        registry, sessions = _tenant(1, 2, 3)
        call = asyncio.ensure_future(registry.call_tenant("job", "park", "GPU-0", DEADLINE))
        for moved, session in enumerate(sessions, start=1):
            await _answer(session, moved)
        return await asyncio.wait_for(call, 5)

    assert asyncio.run(scenario()) == 1 + 2 + 3


def test_a_tenant_whose_every_process_leaves_during_its_park_fails_it_at_once() -> None:
    async def scenario() -> None:
        registry, sessions = _tenant(1, 2)
        call = asyncio.ensure_future(registry.call_tenant("job", "park", "GPU-0", DEADLINE))
        for session in sessions:
            assert await asyncio.wait_for(session.outbox.get(), 5) is not None
            registry.close(session)
        with pytest.raises(TenantGone, match="job disconnected"):
            await asyncio.wait_for(call, 5)

    asyncio.run(scenario())


def test_one_process_that_fails_or_is_late_fails_the_move_naming_it() -> None:
    async def scenario() -> None:
        registry, (first, second) = _tenant(1, 2)
        call = asyncio.ensure_future(registry.call_tenant("job", "park", "GPU-0", DEADLINE))
        await _answer(first, 5)
        message = await asyncio.wait_for(second.outbox.get(), 5)
        assert message is not None
        second.resolve(pb.CallbackResult(call_id=message.callback.call_id, error="out of memory"))
        with pytest.raises(CallbackFailed, match="job: out of memory"):
            await asyncio.wait_for(call, 5)
        late = asyncio.ensure_future(registry.call_tenant("job", "restore", "GPU-0", 0.2))
        await _answer(first, 5)  # the second never answers
        with pytest.raises(CallbackFailed, match=r"within 0\.2 s \(process 2\)"):
            await asyncio.wait_for(late, 5)
        assert not first.pending and not second.pending

    asyncio.run(scenario())


def test_a_callbacks_error_is_passed_on_in_one_line_of_bounded_length() -> None:
    """A tenant's exception text may span lines (a traceback): it reaches another tenant's
    AcquireTimeout and the agent's log as one line."""

    async def scenario() -> CallbackFailed:
        registry, (session,) = _tenant(1)
        call = asyncio.ensure_future(registry.call_tenant("job", "park", "GPU-0", DEADLINE))
        message = await asyncio.wait_for(session.outbox.get(), 5)
        assert message is not None
        error = "RuntimeError: boom\n  File 'x.py', line 1\n" + "y" * 1000
        session.resolve(pb.CallbackResult(call_id=message.callback.call_id, error=error))
        with pytest.raises(CallbackFailed) as failed:
            await asyncio.wait_for(call, 5)
        return failed.value

    said = str(asyncio.run(scenario()))
    assert "\n" not in said and said.startswith(
        "tenant job: RuntimeError: boom File 'x.py', line 1 y"
    )
    assert said.endswith("…") and len(said) <= len("tenant job: ") + 300
