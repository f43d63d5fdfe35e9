"""Open tenant sessions: push messages to a tenant, and ask it to run its park/restore callbacks."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import ClassVar

from agent.core.errors import CallbackFailed, TenantGone
from baton._pb import agent_pb2 as pb

ERROR_CHARS = 300
"""The most of a tenant's callback error passed on (its exception's text, which may hold a whole
traceback)."""


@dataclass(eq=False)
class Session:
    """One tenant process's open stream."""

    tenant_id: str
    pid: int
    token: str
    callbacks: frozenset[str] = frozenset()
    keeps_turns: bool = False
    """Its client keeps a turn across its yield when told it may (`KeepTurn`)."""
    outbox: asyncio.Queue[pb.AgentMessage | None] = field(default_factory=asyncio.Queue)
    """Messages to push; `None` ends the stream."""
    pending: dict[str, asyncio.Future[int]] = field(default_factory=dict)
    ended: bool = False
    """Its stream ended: a callback sent now would go unanswered."""
    names_revoked: ClassVar[bool] = True
    """Its tenant's acquires name the revoked lease whose turn they wait for (a client does,
    having heard the revocation); a stand-in for llm-d's caller, which hears nothing, cannot."""

    def send(self, message: pb.AgentMessage) -> None:
        """Queue a message for the tenant."""
        self.outbox.put_nowait(message)

    def resolve(self, result: pb.CallbackResult) -> None:
        """The tenant answered a callback."""
        future = self.pending.pop(result.call_id, None)
        if future is None or future.done():
            return
        if result.error:  # in one line: it reaches waiters' errors and the agent's log
            said = " ".join(result.error.split())
            if len(said) > ERROR_CHARS:
                said = said[: ERROR_CHARS - 1] + "…"
            future.set_exception(CallbackFailed(f"tenant {self.tenant_id}: {said}"))
        else:
            future.set_result(result.bytes)

    def fail_pending(self) -> None:
        """The stream ended: nobody will answer the open callbacks."""
        self.ended = True
        for future in self.pending.values():
            if not future.done():
                future.set_exception(TenantGone(f"tenant {self.tenant_id} disconnected"))
        self.pending.clear()


class SessionRegistry:
    """The open sessions, per tenant."""

    def __init__(self) -> None:
        self._by_tenant: dict[str, list[Session]] = {}
        self._ids = itertools.count(1)
        self.revision = 0
        """Counts sessions opened and closed."""

    def open(self, session: Session) -> None:
        """Track a new session."""
        self.revision += 1
        self._by_tenant.setdefault(session.tenant_id, []).append(session)

    def close(self, session: Session) -> bool:
        """Stop tracking a session; True if it was the tenant's last."""
        self.revision += 1
        sessions = self._by_tenant.get(session.tenant_id, [])
        if session in sessions:
            sessions.remove(session)
        session.fail_pending()
        if sessions:
            return False
        self._by_tenant.pop(session.tenant_id, None)
        return True

    def connected(self, tenant_id: str) -> bool:
        """Whether the tenant has an open session."""
        return bool(self._by_tenant.get(tenant_id))

    def names_revoked(self, tenant_id: str) -> bool:
        """Whether an open session of the tenant is one whose acquires name a revoked lease
        (`Session.names_revoked`)."""
        return any(s.names_revoked for s in self._by_tenant.get(tenant_id, []))

    def connected_besides(self, tenant_id: str, kind: type[Session]) -> bool:
        """Whether the tenant has an open session that is not a `kind`."""
        return any(not isinstance(s, kind) for s in self._by_tenant.get(tenant_id, []))

    def parks_itself(self, tenant_id: str) -> bool:
        """Whether an open session of the tenant offers both park and restore callbacks."""
        return bool(self._parkers(tenant_id))

    def parks_alone(self, tenant_id: str) -> bool:
        """Whether exactly one open session of the tenant offers park and restore callbacks (its
        process alone moves the tenant's memory)."""
        return len(self._parkers(tenant_id)) == 1

    def _parkers(self, tenant_id: str) -> list[Session]:
        return [s for s in self._by_tenant.get(tenant_id, []) if {"park", "restore"} <= s.callbacks]

    def keeps_turns(self, tenant_id: str) -> bool:
        """Whether the tenant's one open session keeps turns across its yields (with several,
        none is told: a lease is the tenant's, the yield that ends it any of theirs)."""
        sessions = self._by_tenant.get(tenant_id, [])
        return len(sessions) == 1 and sessions[0].keeps_turns

    def tenants(self) -> list[str]:
        """Tenants with open sessions."""
        return list(self._by_tenant)

    def notify(self, tenant_id: str, message: pb.AgentMessage) -> None:
        """Send a message to every session of the tenant."""
        for session in self._by_tenant.get(tenant_id, []):
            session.send(message)

    def notify_parkers(self, tenant_id: str, message: pb.AgentMessage) -> None:
        """Send a message to the tenant's sessions that offer both park and restore callbacks
        (a park-at-yield hint: a process without them has nothing to park)."""
        for session in self._parkers(tenant_id):
            session.send(message)

    async def call_tenant(self, tenant_id: str, action: str, gpu: str, timeout: float) -> int:
        """Ask the tenant to run its `on_<action>(gpu)` callback; returns the bytes it moved.

        Every process of the tenant that offers both callbacks runs its own (the ranks of a
        `torchrun` in one pod, two clients in one process): each parks and restores only its
        own memory, so asking one would leave the others' on the GPU while the tenant counts as
        parked. Their bytes are summed; a failure or a late answer fails the move. All are asked
        in this step, so a session that ends from here on answers at once (`fail_pending`); one
        that left while another answered counts nothing (as a tenant that left is skipped).
        """
        # A park only where the same session can restore: memory parked by a process that
        # cannot bring it back would be stranded. A restore only where a park could have run: a
        # process with on_restore alone parked nothing, and its restore would leave the memory
        # parked while it is counted back on the GPU.
        sessions = self._by_tenant.get(tenant_id, [])
        parkers = self._parkers(tenant_id)
        if not parkers and action == "park" and any("park" in s.callbacks for s in sessions):
            raise CallbackFailed(
                f"tenant {tenant_id} offers no on_park with an on_restore beside it: parking it "
                "would strand its memory (register both callbacks)"
            )
        if not parkers and any("restore" in s.callbacks for s in sessions):
            raise CallbackFailed(
                f"tenant {tenant_id} has no session with on_park and on_restore open (the "
                "process that parked it left): its on_restore alone parked nothing to restore"
            )
        if not parkers:
            raise CallbackFailed(f"tenant {tenant_id} has no session with an on_{action} callback")
        asked = {session: self._ask(session, action, gpu) for session in parkers}
        try:
            _, late = await asyncio.wait([future for _, future in asked.values()], timeout=timeout)
        finally:
            for session, (call_id, _) in asked.items():
                session.pending.pop(call_id, None)
        if late:
            pids = ", ".join(str(s.pid) for s, (_, future) in asked.items() if future in late)
            raise CallbackFailed(
                f"tenant {tenant_id} did not finish on_{action}({gpu}) within {timeout:g} s "
                f"(process {pids})"
            )
        return _total(tenant_id, action, gpu, [future for _, future in asked.values()])

    def _ask(self, session: Session, action: str, gpu: str) -> tuple[str, asyncio.Future[int]]:
        """Send `session` the callback: its call id, and the future its answer (or its end)
        settles."""
        call_id = str(next(self._ids))
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if session.ended:  # nobody would answer
            future.set_exception(TenantGone(f"tenant {session.tenant_id} disconnected"))
            return call_id, future
        session.pending[call_id] = future
        session.send(pb.AgentMessage(callback=pb.Callback(call_id=call_id, action=action, gpu=gpu)))
        return call_id, future


def _total(tenant_id: str, action: str, gpu: str, answers: list[asyncio.Future[int]]) -> int:
    """The bytes the tenant's processes moved: the first failure raised, a process that left
    (`TenantGone`) counted as nothing unless every one did."""
    errors = [e for e in (f.exception() for f in answers) if e is not None]
    moved = [f.result() for f in answers if f.exception() is None]
    failed = next((e for e in errors if not isinstance(e, TenantGone)), None)
    if failed is not None or not moved:
        raise failed or errors[0]
    if any(n < 0 for n in moved):
        raise CallbackFailed(
            f"tenant {tenant_id}: on_{action}({gpu}) returned {min(moved)} bytes moved; a "
            "callback returns the bytes it moved (0 or more) or None"
        )
    return sum(moved)
