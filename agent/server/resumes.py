"""Which turn gives a revoked lease's tenant the GPU back (`agent.server.turns`).

A lease revoked at the maximum hold (or for a higher tier) queues its tenant first for the turn
after: that waiter, granted, is a new lease. A yield that names the revoked lease ends the one
that followed it, however many revocations ago; a job's turn (`agent.server.jobturns`) hears of
each revocation so that its record names the member's lease that follows.

A resume survives an agent restart: the journal holds it from the write of its revocation's
end until its grant or an end naming it (it left the queue ungranted), and the restarted agent
queues it first again, under the same id. A grant of it that found no session of its tenant is
told to the tenant's next session (`unheard`). A renewal of the revoked lease, from a client
that never heard of the revocation (its session was down, or the agent restarted), is answered
with the resume (`following`); a yield naming it ends that resume only.

An acquire of the tenant's while its resume waits joins it (`owed`, `join`): the resume's grant
answers that acquire instead of a push, and the acquire's deadline leaves the resume queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

from agent.core.errors import AcquireTimeout, AgentError, AlreadyHolding
from agent.core.leases import Lease, LeaseTable
from agent.core.waiters import Waiter
from agent.node.state_json import SavedResume
from agent.node.tenants import Tenant
from agent.server.sessions import SessionRegistry
from agent.server.waits import lease_to_pb
from baton._pb import agent_pb2 as pb

Follow = Callable[[str, str, str], None]
"""Hears (tenant id, revoked lease id, id of the waiter that resumes it, then its lease)."""
log = logging.getLogger(__name__)


def late(resume: Waiter, why: str) -> AcquireTimeout:
    """The error of an acquire whose deadline came while it waited for `resume`, which stays
    queued (`why`: where it stands)."""
    return AcquireTimeout(
        f"no turn on [{', '.join(resume.gpus)}] within the timeout; it waited for its revoked "
        "turn to be given back, which stays first in the queue for it (the agent gives it back "
        f"as the GPUs free); it waited because {why}"
    )


class _Joined(NamedTuple):
    """An acquire waiting for a resume: its answer, and who hears of the grant as it is made."""

    future: asyncio.Future[Lease]
    tell: Callable[[Lease], None] | None


class Resumes:
    """Revoked lease id → the waiter (then lease) that gives its tenant the turn back."""

    def __init__(self) -> None:
        self._next: dict[str, str] = {}
        self.follow: Follow | None = None
        """Who hears of each resume as its revocation queues it (the node's job turns)."""
        self._new: list[SavedResume] = []
        """Resumes queued in this step, for the journal's next write."""
        self._journaled: set[str] = set()
        """The resumes the journal holds as waiting."""
        self.unheard: dict[str, str] = {}
        """Tenant id → the lease that gave it its turn back while none of its sessions was open."""
        self.withdrawn: dict[str, list[pb.Revoked]] = {}
        """Tenant id → what its next session hears of the resume it lost, not reconnecting."""
        self._left: dict[str, asyncio.Event] = {}
        """Resume (waiter id) → set as it leaves the queue (`left`)."""
        self.joined: dict[str, _Joined] = {}
        """Resume (waiter id) → the acquire of its tenant that waits for it (`join`)."""

    def revoked(self, lease: Lease, resume: Waiter, table: LeaseTable) -> None:
        """`lease` was revoked and `resume` queued to give it back. A resumed lease revoked
        again passes its resume on: each id that led to it leads to the new one."""
        live = table.waiters.keys() | table.leases.keys()
        revoked, resume_id = lease.lease_id, resume.waiter_id
        self._next = {
            k: resume_id if v == revoked else v
            for k, v in self._next.items()
            if v in live or v == revoked
        }
        self._next[revoked] = resume_id
        self._new.append(self._saved(resume))
        if self.follow is not None:
            self.follow(lease.tenant_id, revoked, resume_id)

    def take(self, lease_id: str) -> str:
        """The turn that followed the revoked `lease_id` ("" if none), forgotten here."""
        return self._next.pop(lease_id, "")

    def given(self, lease: Lease, sessions: SessionRegistry) -> None:
        """A resume was granted as `lease`: the acquire that joined it is answered with it, or
        its tenant's sessions hear of it, or its next one."""
        joined = self.joined.pop(lease.lease_id, None)
        if joined is not None and not joined.future.done():
            if joined.tell is not None:
                joined.tell(lease)
            joined.future.set_result(lease)
        elif sessions.connected(lease.tenant_id):
            sessions.notify(lease.tenant_id, pb.AgentMessage(granted=lease_to_pb(lease)))
        else:
            self.unheard[lease.tenant_id] = lease.lease_id

    def following(self, tenant_id: str, lease_id: str, table: LeaseTable) -> Lease | Waiter | None:
        """What follows `lease_id`, a revoked lease of the tenant's: the turn that gave it back,
        or the resume that will (None: neither is the tenant's any more). A yield naming it
        ends that turn; a renewal of it is answered with it (its client may never have heard of
        the revocation: the push went to no session of its process, it was down or the agent
        restarted; a client that did hear it heard it first, the renewal's answer following
        the push on the session, and ignores the answer)."""
        resume = self._next.get(lease_id, "")
        found = table.leases.get(resume) or table.waiters.get(resume)
        return found if found is not None and found.tenant_id == tenant_id else None

    def ending(self, tenant_id: str, lease_id: str, table: LeaseTable) -> Lease | Waiter | None:
        """The turn a yield of the tenant's naming `lease_id`, no lease it holds, ends: the one
        following it, a revoked lease (`following`), or the resume of that id itself (a job's
        turn names the resume that gives its member the GPUs back: its lease, once granted).
        None: no turn of the tenant's."""
        found = self.following(tenant_id, lease_id, table)
        if found is not None:
            return found
        resume = table.waiters.get(lease_id)
        if resume is None or not resume.front or resume.tenant_id != tenant_id:
            return None
        return resume

    def owed(
        self, tenant_id: str, wanted: Sequence[str], revoked: str, table: LeaseTable, alone: bool
    ) -> Lease | Waiter | None:
        """The turn an acquire of the tenant's on `wanted` takes instead of queueing: the one
        that gives its revoked lease `revoked` back (named by its client), granted already (its
        push crossed the acquire) or still queued; with none named, its queued resume on
        `wanted` if no session of it names revoked leases (`alone`: an llm-d job, a bare
        caller)."""
        found: Lease | Waiter | None = None
        if revoked:
            resume = self._next.get(revoked, "")
            found = table.leases.get(resume) or table.waiters.get(resume)
        elif alone:
            found = self.queued(tenant_id, wanted, table)
        if found is None or found.tenant_id != tenant_id or set(found.gpus) != set(wanted):
            return None
        return found

    @staticmethod
    def queued(tenant_id: str, gpus: Sequence[str], table: LeaseTable) -> Waiter | None:
        """The tenant's resume on `gpus` still waiting in the queue, if there is one."""
        wanted = set(gpus)
        front = (
            w
            for w in table.waiters.values()
            if w.front and w.tenant_id == tenant_id and set(w.gpus) == wanted
        )
        return next(front, None)

    @staticmethod
    def cancel(tenant_id: str, gpus: Sequence[str], table: LeaseTable) -> bool:
        """Take the tenant's resumes (only the one on `gpus`, if named) out of the queue: the
        turns they were to give back are not; whether there was one."""
        wanted = set(gpus)
        resumes = [
            w.waiter_id
            for w in table.waiters.values()
            if w.front and w.tenant_id == tenant_id and (not gpus or set(w.gpus) == wanted)
        ]
        for waiter_id in resumes:
            table.cancel(waiter_id)
        return bool(resumes)

    async def join(
        self,
        resume: Waiter,
        timeout: float | None,
        tell: Callable[[Lease], None] | None,
        why: Callable[[], str],
        sessions: SessionRegistry,
    ) -> Lease:
        """Wait for `resume`'s grant (`tell` hears of it as it is made); `AcquireTimeout` after
        `timeout` seconds (`why`: where the resume stands), the resume staying queued."""
        waiter_id, gpus = resume.waiter_id, ", ".join(resume.gpus)
        if waiter_id in self.joined:
            raise AlreadyHolding(
                f"tenant {resume.tenant_id!r} already waits for {gpus}: another acquire of it "
                "waits for its revoked turn to be given back"
            )
        loop = asyncio.get_running_loop()
        joined = self.joined[waiter_id] = _Joined(loop.create_future(), tell)

        def expire() -> None:
            if self.joined.get(waiter_id) is joined:
                del self.joined[waiter_id]
                joined.future.set_exception(late(resume, why()))

        timer = None if timeout is None else loop.call_later(timeout, expire)
        try:
            return await joined.future
        except asyncio.CancelledError:  # its caller left: a grant made meanwhile is pushed
            done = joined.future.done() and not joined.future.cancelled()
            if done and joined.future.exception() is None:
                self.given(joined.future.result(), sessions)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if self.joined.get(waiter_id) is joined:
                del self.joined[waiter_id]

    async def left(self, waiter_id: str, within: float) -> None:
        """Return once the resume `waiter_id` has left the queue (granted, or given up), as the
        step that took it out settles, or after `within` seconds."""
        event = self._left.setdefault(waiter_id, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), within)

    def settle(self, table: LeaseTable) -> None:
        """After a step: those waiting for a resume that left the queue (`left`) wake, and
        acquires joined to one that left it ungranted (a yield gave it up, its tenant left)
        hear so."""
        if not (self._left or self.joined):  # every step of every handoff comes here
            return
        for waiter_id in [k for k in self._left if k not in table.waiters]:
            self._left.pop(waiter_id).set()
        for waiter_id in [k for k in self.joined if k not in table.waiters]:
            joined = self.joined.pop(waiter_id)
            if not joined.future.done():
                joined.future.set_exception(
                    AgentError(
                        "the revoked turn this acquire waited to be given back was given up "
                        "before it came back (a yield ended it, or the tenant left); acquire "
                        "again for a new turn"
                    )
                )

    def withdraw(self, tenant_id: str, table: LeaseTable, why: str) -> None:
        """The tenant is dropped as no session of it came back: the turn it was to be given back
        (waiting, or granted unheard) goes too, and its next session hears why, as revocations
        of the leases it gave back (the one its client last held among them)."""
        resumes = [
            w.waiter_id for w in table.waiters.values() if w.front and w.tenant_id == tenant_id
        ]
        resumes.append(self.unheard.pop(tenant_id, ""))
        led = [k for k, v in self._next.items() if v in resumes]
        if led:
            self.withdrawn[tenant_id] = [
                pb.Revoked(lease_id=k, reason=why, withdrawn=True) for k in led
            ]

    def reconnected(self, tenant_id: str, table: LeaseTable, sessions: SessionRegistry) -> bool:
        """A session of the tenant opened: it hears of the turn given back to it while none was
        open, if it still holds it, or of its withdrawal. Whether a resume of the tenant waits
        (to be tried now)."""
        for withdrawn in self.withdrawn.pop(tenant_id, ()):
            sessions.notify(tenant_id, pb.AgentMessage(revoked=withdrawn))
        lease = table.leases.get(self.unheard.pop(tenant_id, ""))
        if lease is not None and lease.tenant_id == tenant_id:
            log.info(
                "tenant %s reconnected: it hears of its turn %s given back",
                tenant_id,
                lease.lease_id,
            )
            sessions.notify(tenant_id, pb.AgentMessage(granted=lease_to_pb(lease)))
        return any(w.front and w.tenant_id == tenant_id for w in table.waiters.values())

    def _saved(self, waiter: Waiter) -> SavedResume:
        led = tuple(k for k, v in self._next.items() if v == waiter.waiter_id)
        return SavedResume(waiter.waiter_id, waiter.tenant_id, waiter.gpus, led)

    # Persistence.

    def to_journal(
        self, table: LeaseTable, granted: str = ""
    ) -> tuple[list[SavedResume], list[str]]:
        """What the journal's next write (with the grant of `granted`, if any) says of resumes:
        those queued since the last, and the ids of those that left the queue ungranted."""
        if not self._new and not self._journaled:  # most writes: no resume at all
            return [], []
        new, self._new = self._new, []
        self._journaled.discard(granted)
        self._journaled.update(r.waiter_id for r in new)
        left = [r for r in self._journaled if r not in table.waiters]
        self._journaled.difference_update(left)
        return new, left

    def pending(self, table: LeaseTable) -> bool:
        """Whether the journal's record of the resumes is behind the queue."""
        return bool(self._new) or any(r not in table.waiters for r in self._journaled)

    def snapshot(self, table: LeaseTable) -> dict[str, SavedResume]:
        """The resumes waiting now, for the snapshot."""
        front = (w for w in table.waiters.values() if w.front)
        return {w.waiter_id: self._saved(w) for w in front}

    def given_back(self, table: LeaseTable) -> dict[str, tuple[str, ...]]:
        """The turns given back and held now → the revoked leases they follow, for the
        snapshot."""
        led: dict[str, list[str]] = {}
        for revoked, resume in self._next.items():
            if resume in table.leases:
                led.setdefault(resume, []).append(revoked)
        return {k: tuple(v) for k, v in led.items()}

    def restore_given(self, table: LeaseTable, given: Mapping[str, Sequence[str]]) -> None:
        """The turns given back before the restart (`given_back`) follow their revoked leases
        again, and their tenants' next sessions hear of them (a client may never have: the
        grant found no session of it, or its push died with the agent before)."""
        for lease_id, revoked in given.items():
            lease = table.leases.get(lease_id)
            if lease is None:
                continue
            self._next.update(dict.fromkeys(revoked, lease_id))
            self.unheard[lease.tenant_id] = lease_id

    def restore(
        self, table: LeaseTable, saved: Iterable[SavedResume], tenants: Mapping[str, Tenant]
    ) -> list[SavedResume]:
        """Queue the saved resumes first again, each under its own id; those queued."""
        restored = []
        for resume in saved:
            tenant = tenants.get(resume.tenant_id)
            if tenant is None:
                continue  # its tenant left: the resume went with it
            try:
                waiter = table.enqueue(
                    tenant.tenant_id,
                    resume.gpus,
                    front=True,
                    duty=tenant.gpu_duty,
                    tier=tenant.priority,
                )
            except AlreadyHolding as exc:
                log.warning("the saved resume %s is dropped: %s", resume.waiter_id, exc)
                continue
            del table.waiters[waiter.waiter_id]
            waiter.waiter_id = resume.waiter_id  # the id its job turn names, and its lease's
            table.waiters[waiter.waiter_id] = waiter
            self._journaled.add(waiter.waiter_id)
            self._next.update(dict.fromkeys(resume.revoked, waiter.waiter_id))
            restored.append(resume)
        return restored
