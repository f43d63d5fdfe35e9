"""Turns: the lease table driven by requests, time and the residency layer.

Grants happen as soon as the state allows (a yield, a departure, a registration), never by
polling; a single timer covers waiter deadlines and maximum hold times (`agent.server.turn_clock`,
which also lets the residency layer make room for the tenant due next while the holder still
runs). The state it drives is `agent.server.turn_state`'s; `agent.server.service` wires the two
with the tenants (`agent.server.tenancy`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from agent.core import eager
from agent.core import events as ev
from agent.core.errors import InvalidGpus, NoLease, Quarantined, UnknownLease
from agent.core.leases import Lease, Waiter
from agent.core.residency import NoRoom, TooLarge
from agent.node.tenants import Tenant
from agent.server.owed import join, owed_turn, renewed
from agent.server.resumes import Resumes
from agent.server.revocations import Revocations
from agent.server.turn_clock import TurnClock
from agent.server.turn_state import Granted, TurnState
from agent.server.waits import lease_to_pb, never_granted, tell_blocked

__all__ = ["Granted", "Turns", "lease_to_pb"]

log = logging.getLogger(__name__)

Answer = Callable[[float], None] | None
"""Tells a yielder its yield is done (the seconds it held the turn), or None."""
Ago = float | None
"""A yield's: the seconds since its caller yielded (more than 0 for a kept turn); None: no yield."""


class Turns:
    """Turn-taking on the node's GPUs: acquire, yield, grants, revocation, timeouts.
    `unwatched` hears, `reconnect_grace` after the grant, of a tenant granted a turn without an
    open session."""

    def __init__(self, state: TurnState, unwatched: Callable[[str], None]) -> None:
        self._state = state
        self._unwatched = unwatched
        self.table = state.table
        self.revocations = Revocations()
        self._pending: dict[str, asyncio.Future[Lease]] = {}
        self._on_grant: dict[str, Callable[[Lease], None]] = {}
        """Waiter id → who hears of its grant as it is made (`acquire`)."""
        self.resumes: Resumes = state.resumes
        self._changes = 0
        self._clock = TurnClock(state, self.revocations, self)

    def close(self) -> None:
        """Stop the timer: no more revocations or timeouts."""
        self._clock.close()

    def retell(self) -> None:
        """Tell the holders again what they may do (a tenant's sessions changed)."""
        self._clock.settle_soon()

    def fail(self, waiter_id: str, error: Exception) -> None:
        """The waiter's `acquire` raises `error` (its place in the queue is already gone)."""
        self._on_grant.pop(waiter_id, None)
        future = self._pending.pop(waiter_id, None)
        if future is not None and not future.done():
            future.set_exception(error)

    # Turns.

    async def acquire(
        self,
        tenant: Tenant,
        gpus: Sequence[str],
        timeout: float | None,
        on_grant: Callable[[Lease], None] | None = None,
        handed: bool = False,
        revoked: str = "",
    ) -> Granted:
        """Wait for the turn on `gpus` (all of the tenant's GPUs if empty). `on_grant` hears of
        the grant as it is journaled, before this returns (a direct session writes it then, in
        the step that freed the GPU). `handed`: see `Waiter.handed` (one parker only). A turn
        owed to the tenant (`agent.server.owed`; `revoked`: the lease it gives back) is taken."""
        wanted = tuple(gpus) or tenant.gpus
        foreign = sorted(set(wanted) - set(tenant.gpus))
        if foreign or not wanted:
            raise InvalidGpus(
                f"tenant {tenant.tenant_id} was given GPUs [{', '.join(tenant.gpus)}]; "
                f"it cannot acquire [{', '.join(foreign) or 'none'}]"
            )
        parking = self._state.parking
        if parking is not None and (large := parking.never_fits(tenant.tenant_id)) is not None:
            error = never_granted(sorted(set(wanted)), large)  # at once, not behind a holder
            self._state.publish(ev.CANCELLED, tenant.tenant_id, gpus=wanted, detail=str(large))
            raise error
        owed = owed_turn(self._state, tenant.tenant_id, wanted, revoked)
        if isinstance(owed, Lease):
            return Granted(owed, 0.0)
        if owed is not None:
            return await join(self._state, owed, timeout, on_grant)
        waiter = self.table.enqueue(
            tenant.tenant_id, wanted, timeout=timeout, duty=tenant.gpu_duty, tier=tenant.priority
        )
        waiter.handed = handed and self._state.sessions.parks_alone(tenant.tenant_id)
        future: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()
        self._pending[waiter.waiter_id] = future
        if on_grant is not None:
            self._on_grant[waiter.waiter_id] = on_grant
        with self._state.grants_first():
            self._state.publish(ev.QUEUED, tenant.tenant_id, gpus=waiter.gpus)
            self.dispatch()
        try:
            lease = await future
        except asyncio.CancelledError:
            self._abandon(waiter.waiter_id)
            raise
        return Granted(lease, lease.granted_at - waiter.enqueued_at)

    def _abandon(self, waiter_id: str) -> None:
        self._pending.pop(waiter_id, None)
        self._on_grant.pop(waiter_id, None)
        waiter = self.table.cancel(waiter_id)
        if waiter is not None:
            self._state.publish(ev.CANCELLED, waiter.tenant_id, gpus=waiter.gpus)
            self.dispatch()
        elif waiter_id in self.table.leases and not self._state.stopping:
            # Granted just as the caller gave up. Not when the agent is stopping: then the call
            # is cancelled by the shutdown, the grant may already have reached its tenant (a
            # direct session writes it as it is made), and the turn is the next agent's to keep.
            self._end(self.table.leases[waiter_id], ev.YIELDED, "caller gave up")

    def yield_(self, tenant: Tenant, lease_id: str, answer: Answer = None, ago: float = 0) -> float:
        """End the tenant's turn; returns how long it held it. Where that starts no turn,
        `answer` hears so once the end is on disk, before the rest (the yielder usually asks
        again at once); where it does, the grant goes first and `answer` is not called."""
        if not lease_id:
            mine = self.table.leases_of(tenant.tenant_id)
            if not mine and self.cancel_resume(tenant.tenant_id):
                return 0.0
            if len(mine) != 1:
                raise NoLease(
                    f"tenant {tenant.tenant_id} holds {len(mine) or 'no'} leases; "
                    "acquire first, or name the lease to yield"
                )
            lease_id = mine[0].lease_id
        try:
            lease = self.table.lease(lease_id, tenant.tenant_id)
        except UnknownLease:  # revoked: the turn following it ends, no other of the tenant's
            resume = self.resumes.ending(tenant.tenant_id, lease_id, self.table)
            if resume is None:
                raise
            self.resumes.take(lease_id)
            if isinstance(resume, Waiter):  # not given back yet: it never is
                self.table.cancel(resume.waiter_id)
                self.changed()
                return 0.0
            lease = resume
        return self._end(lease, ev.YIELDED, "", yielded=ago, answer=answer)

    def inspect(self, tenant: Tenant, lease_id: str) -> Lease:
        """One of the tenant's own leases (renewing it is the same check: a restored lease the
        client names is claimed)."""
        try:
            lease = self.table.lease(lease_id, tenant.tenant_id)
        except UnknownLease as gone:  # revoked, maybe unheard: its resume answers
            return renewed(self._state, tenant.tenant_id, lease_id, gone)
        self._state.unclaimed.discard(lease_id)
        return lease

    def cancel_resume(self, tenant_id: str, gpus: Sequence[str] = ()) -> bool:
        """Give up the turns the node revoked from the tenant and has yet to give back (only
        the one on `gpus`, if named); whether there was one."""
        if not self.resumes.cancel(tenant_id, gpus, self.table):
            return False
        self.changed()
        return True

    def expire(self, waiter: Waiter, error: Exception, why: str) -> None:
        """`waiter` left the queue past its deadline: its acquire raises `error`, and the
        `expired` event says `why` (`TurnClock`, or `LeaseService.expire`)."""
        self.fail(waiter.waiter_id, error)
        self._state.publish(ev.EXPIRED, waiter.tenant_id, gpus=waiter.gpus, detail=why)

    def _end(
        self, lease: Lease, kind: str, detail: str, *, yielded: Ago = None, answer: Answer = None
    ) -> float:
        """End the turn and start the next: its grant is written (with this end, in one journal
        write) and sent before the metrics and events of either are taken (`answer`: `yield_`)."""
        self.table.release(lease.lease_id, yielded=yielded is not None, kept_s=yielded or 0.0)
        self._state.preparer.released(lease.tenant_id, lease.gpus)
        self._state.journal_end(lease)
        now = self._state.clock()
        held = max(0.0, now - lease.granted_at)

        def first(chosen: list[Waiter]) -> None:
            if answer is not None and not chosen:
                self._state.journal_flush()
                answer(held)

        with self._state.grants_first():
            self._state.later(lambda: self._state.metrics.released(lease, now))
            self._state.publish(kind, lease.tenant_id, lease=lease, detail=detail)
            self.changed(first)
        return held

    # Granting.

    def changed(self, picked: Callable[[list[Waiter]], None] | None = None) -> None:
        """The node changed: persist it, retry blocked waiters, grant what can be (`picked`)."""
        self._changes += 1
        self.table.unblock_all()
        self.dispatch(picked)
        self._state.journal_flush()  # the ends no grant took along
        # After the grants: their waiters resume before the state is encoded.
        self._state.persist_step()

    def dispatch(self, picked: Callable[[list[Waiter]], None] | None = None) -> None:
        """Start the turns the table picks now (`picked` hears which first)."""
        chosen = self.table.pick()
        if picked is not None:
            picked(chosen)
        self.start_turns(chosen)
        self._clock.settle_soon()

    def start_turns(self, waiters: list[Waiter]) -> None:
        """Make room for each waiter, then grant its turn (`_prepared`)."""
        for waiter in waiters:
            changes = self._changes
            try:
                done, _, rest = eager.start(
                    self._state.preparer.prepare(waiter.tenant_id, waiter.gpus, waiter.handed)
                )
            except Exception as exc:
                self._prepared(waiter, exc, changes)
                continue
            if done or rest is None:
                self._prepared(waiter, None, changes)
            else:
                self._state.spawn(self._finish_preparing(waiter, rest, changes))

    async def _finish_preparing(self, waiter: Waiter, rest: eager.Rest[None], changes: int) -> None:
        try:
            await rest
        except Exception as exc:
            self._prepared(waiter, exc, changes)
            return
        self._prepared(waiter, None, changes)

    def _prepared(self, waiter: Waiter, error: Exception | None, changes: int) -> None:
        """Room was made for `waiter` (or not): grant the turn, or keep it waiting."""
        if isinstance(error, Quarantined | TooLarge):  # never a turn: the caller hears why now
            self.table.cancel(waiter.waiter_id)
            self.fail(waiter.waiter_id, never_granted(waiter.gpus, error))
            if isinstance(error, TooLarge):
                self._state.publish(
                    ev.CANCELLED, waiter.tenant_id, gpus=waiter.gpus, detail=str(error)
                )
            self.dispatch()
            return
        self.revocations.moves_failed(error, self._state.clock())
        if isinstance(error, NoRoom):
            self._blocked(waiter, str(error), changes)
            return
        if error is not None:
            log.error("making room for %s failed: %s", waiter.tenant_id, error)
            self._blocked(waiter, f"making room failed: {error}", changes)
            return
        if waiter.waiter_id not in self.table.waiters:  # gave up while room was made
            # The preparer counts it holding the turn it made room for: it holds none.
            held = {g for lease in self.table.leases_of(waiter.tenant_id) for g in lease.gpus}
            unheld = [g for g in waiter.gpus if g not in held]
            self._state.preparer.released(waiter.tenant_id, unheld)
            self.dispatch()
            return
        lease = self.table.grant(waiter.waiter_id)
        self._state.journal_grant(lease)
        tell = self._on_grant.pop(waiter.waiter_id, None)
        if tell is not None:
            tell(lease)
        waited = lease.granted_at - waiter.enqueued_at
        self._state.later(lambda: self._state.metrics.granted(lease, waited))
        self._state.publish(ev.GRANTED, lease.tenant_id, lease=lease)
        future = self._pending.pop(waiter.waiter_id, None)
        if future is not None and not future.done():
            future.set_result(lease)
        elif waiter.front:
            self.resumes.given(lease, self._state.sessions)
        self._state.persist_step()
        if not self._state.sessions.connected(lease.tenant_id):  # a bare RPC caller: no watch
            loop = asyncio.get_running_loop()
            loop.call_later(self._state.grace, self._unwatched, lease.tenant_id)
        self._clock.settle_soon()

    def _blocked(self, waiter: Waiter, reason: str, changes: int) -> None:
        if waiter.waiter_id not in self.table.waiters:
            self.dispatch()
            return
        self.table.block(waiter.waiter_id, reason)
        tell_blocked(self._state.sessions, waiter, reason)
        if changes != self._changes:  # the node changed while room was being made
            self.changed()
        else:
            self.dispatch()
