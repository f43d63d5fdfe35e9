"""What the lease service holds (table, tenants, sessions, events, metrics, the state store) and
how it publishes events, persists and restores the state and runs background work."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from agent.core import events as ev
from agent.core import fairsave
from agent.core.leases import Lease, LeaseTable
from agent.core.residency import TurnPreparer
from agent.core.waiters import TenantUsage
from agent.node.state import PersistedState, StateDirError, StateStore
from agent.node.tenants import Tenant, TenantRegistry
from agent.parking.backends.base import RecordError, TenantRef
from agent.parking.host import Parking, parking_of
from agent.parking.multi import records_by_method
from agent.server.metrics import AgentMetrics
from agent.server.resumes import Resumes
from agent.server.sessions import SessionRegistry
from baton.contract.names import MIB

CLOSE_WAIT_S = 5.0
"""How long closing waits for the background work it cancelled to end."""
SAVE_DELAY_S = 1.0
"""How long after a change the whole state is saved, with every change made meanwhile: at most
one snapshot a second, never in the step of a handoff. Everything a restart needs is in the
journal at once (`agent.node.state`: grants, ends, tenants joined, changed and gone, parked
memory), so the snapshot only checkpoints it and adds the accounting, of which a crash loses at
most this much. Written after every turn, a snapshot's encoding, temporary file and rename were
a third of an agent's CPU in short turns, competing with the tenants for the node's cores."""

_NAMES_METHOD = frozenset({ev.TENANT_JOINED, ev.QUEUED, ev.GRANTED})
"""Events whose detail also names the tenant's parking method (`parking app`)."""


@dataclass
class Granted:
    """What an acquire returns: the lease and how long the tenant waited."""

    lease: Lease
    waited: float


def tenant_ref(tenant: Tenant, self_parks: bool = False) -> TenantRef:
    """What a parking backend needs to know of one of the service's tenants (`self_parks`: a
    session of it offers park/restore callbacks)."""
    return TenantRef(
        tenant.tenant_id,
        tuple(tenant.gpus),
        pids=tuple(sorted(tenant.pids)),
        memory_limit_bytes=tenant.memory_limit_bytes or None,
        pod_uid=tenant.pod_uid,
        declared_bytes=tenant.gpu_memory_mib * MIB or None,
        parking=tenant.parking,
        self_parks=self_parks,
    )


class TurnState:
    """The state the turns and the tenants share, its events, its persistence and the
    background tasks; it grants nothing (`agent.server.turns`) and admits nobody
    (`agent.server.tenancy`)."""

    def __init__(
        self,
        *,
        table: LeaseTable,
        preparer: TurnPreparer,
        clock: Callable[[], float],
        store: StateStore | None = None,
        metrics: AgentMetrics | None = None,
        reconnect_grace: float = 10.0,
        sessions: SessionRegistry | None = None,
        forget_departed_after: float = 3600.0,
    ) -> None:
        self.table = table
        self.preparer = preparer
        self.parking: Parking | None = parking_of(preparer)
        """The preparer as a `Parking`, or None where the node parks nothing."""
        self.tenants = TenantRegistry()
        self.sessions = sessions or SessionRegistry()
        self.events = ev.EventBus()
        self.metrics = metrics or AgentMetrics()
        self.clock = clock
        self.grace = reconnect_grace
        """Seconds a tenant has to open (or reopen) its session."""
        self.forget_departed_after = forget_departed_after
        """Seconds after which a departed tenant's totals fold into its namespace's
        `<namespace>/(departed)` (`agent.server.accounting`); 0 = never."""
        self.stopping = False
        self._store = store
        self._tasks: set[asyncio.Task[None]] = set()
        self._persist_soon = False
        self._save_timer: asyncio.TimerHandle | None = None
        self._ended: list[str] = []
        """Turns ended in this step whose journal lines wait for the grant they make room for
        (one write for both), or for `journal_flush`."""
        self._after: list[Callable[[], object]] | None = None
        """Bookkeeping held back while `grants_first` is open, in the order it was asked for."""
        self._grants_first = _GrantsFirst(self)
        self.resumes = Resumes()
        """The revoked tenants queued to get their turns back (`agent.server.turns`)."""
        self.unclaimed: set[str] = set()
        """Leases restored from the state that no client has named since the restart: their
        grant may never have reached the tenant (`Turns.acquire` hands one back)."""
        self._closed = False
        self._persist_asked = False
        """`persist()` was called and its step has not journaled the parked record yet (close
        saves it then)."""

    async def close(self) -> None:
        """Cancel background work and save what is due; the persisted state stays as it is."""
        self.stopping = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:  # what they moved before the cancel reached them is saved below
            await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
        self.account()  # the parked byte-seconds since the last save are due too
        self.journal_flush()
        if self._save_timer is not None:
            self._save_timer.cancel()
        if self._store is not None and (self._persist_soon or self._persist_asked):
            self._save()  # the parked record too
        self._persist_asked = False
        self._closed = True
        if self._store is not None:
            self._store.flush()
            self._store.close()

    # Events and background work.

    def unrecorded(self) -> str | None:
        """Why the turns and parked memory of now are not on disk (`StateStore.unrecorded`)."""
        return None if self._store is None else self._store.unrecorded

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run `coro` in the background until it ends or the service closes."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def grants_first(self) -> _GrantsFirst:
        """Hold events and metrics back until the block ends, so that a grant it makes reaches
        its tenant first; they then run in the order they were asked for. Nested: the outermost
        block runs them."""
        return self._grants_first

    def later(self, step: Callable[[], object]) -> None:
        """Run `step` (bookkeeping) at the end of `grants_first`, or now outside it."""
        if self._after is None:
            step()
        else:
            self._after.append(step)

    def publish(
        self,
        kind: str,
        tenant_id: str,
        *,
        lease: Lease | None = None,
        gpus: tuple[str, ...] = (),
        detail: str = "",
    ) -> None:
        """Tell the event bus (after the grants, inside `grants_first`); a tenant's joining,
        queueing and grants also name its parking method: `pod; parking app`."""
        at = self.clock()
        self.later(lambda: self._publish(kind, tenant_id, at, lease, gpus, detail))

    def _publish(
        self,
        kind: str,
        tenant_id: str,
        at: float,
        lease: Lease | None,
        gpus: tuple[str, ...],
        detail: str,
    ) -> None:
        method = self.parking_method(tenant_id) if kind in _NAMES_METHOD else ""
        if method:
            detail = f"{detail}; parking {method}" if detail else f"parking {method}"
        self.events.publish(
            ev.Event(
                kind=kind,
                tenant_id=tenant_id,
                at=at,
                gpus=lease.gpus if lease else gpus,
                lease_id=lease.lease_id if lease else "",
                tokens=dict(lease.tokens) if lease else {},
                detail=detail,
            )
        )

    def parking_method(self, tenant_id: str) -> str:
        """The method that parks the tenant; empty where the node parks nobody."""
        tenant = self.tenants.tenants.get(tenant_id)
        if tenant is None or self.parking is None:
            return ""
        ref = tenant_ref(tenant, self.sessions.parks_itself(tenant_id))
        return self.parking.method_for(ref)

    def account(self) -> None:
        """Bring the parked byte-seconds up to now (before they are read or saved). What this
        adds is saved within `SAVE_DELAY_S`: a restart takes back no more of what a scrape
        showed than a crash in that delay loses (a counter that goes down reads as a reset)."""
        tiers = {t: u.tier for t, u in self.table.usage.items()}
        acct, now = self.metrics.accounting, self.clock()
        added = acct.parked(now, self.preparer.parked_by_tenant(), tiers)
        folded = acct.fold(now, self.forget_departed_after)
        if (added or folded) and not self._closed:
            self.persist_step()

    def tenant_left(self, tenant_id: str) -> None:
        """The tenant left the node: its totals fold after `forget_departed_after`; when it
        left is saved with them."""
        if self.forget_departed_after > 0:
            self.metrics.accounting.left(tenant_id, self.clock())
            self.persist_step()

    def tenant_back(self, tenant_id: str) -> None:
        """A tenant joined under an id that had left (a pod recreated under its name, a local
        tenant registering again): its totals are its own again, not to be folded."""
        if self.metrics.accounting.returned(tenant_id):
            self.persist_step()

    # Persistence.

    def journal_tenant(self, tenant: Tenant) -> None:
        """A tenant registered or changed: on disk before its first grant (`agent.node.state`)."""
        if self._store is not None:
            self._store.record_tenant(tenant)

    def journal_grant(self, lease: Lease) -> None:
        """The grant is on disk before anyone hears of it (`agent.node.state`), with the ends
        of the turns before it and, if memory moved for it (`persist`), the parking record:
        one write."""
        ended, self._ended = self._ended, []
        parked = self.preparer.durable() if self._persist_asked else None
        self._persist_asked = False
        resumed, left = self.resumes.to_journal(self.table, lease.lease_id)
        if self._store is not None:
            self._store.record_grant(lease, ended + left, parked, resumed)

    def journal_end(self, lease: Lease) -> None:
        """A turn ended: written with the grant that follows in this step, or by
        `journal_flush`, before anyone hears of either."""
        self._ended.append(lease.lease_id)

    def journal_flush(self) -> None:
        """Write the ends no grant took along, and the resumes queued or gone since the last
        write (`agent.server.resumes`)."""
        ended, self._ended = self._ended, []
        resumed, left = self.resumes.to_journal(self.table)
        if (ended or resumed or left) and self._store is not None:
            self._store.record_end(*ended, *left, resumes=resumed)

    def journal_resumes(self) -> None:
        """Write the resumes queued or gone since the last write, if any."""
        if self.resumes.pending(self.table):
            self.journal_flush()

    def journal_gone(self, tenant_id: str) -> None:
        """A tenant left: on disk at once (`agent.node.state`)."""
        if self._store is not None:
            self._store.record_gone(tenant_id)

    def persist(self) -> None:
        """The residency layer moved memory (or forgot a tenant): its record of what is parked
        goes to the journal with the grant the moves made room for, or else in the next
        event-loop step, and the snapshot follows within `SAVE_DELAY_S`. The accounting
        charges what was parked until now, and what is parked from now."""
        if self._closed:  # the last snapshot is written, the store shut
            return
        self.account()
        self._persist_asked = True
        asyncio.get_running_loop().call_soon(self._persist_now)

    def _persist_now(self) -> None:
        if not self._persist_asked:  # a grant's write or the closing snapshot took it along
            return
        self._persist_asked = False
        if self._store is not None:
            self._store.record_parked(self.preparer.durable())
        self.persist_step()

    def persist_step(self) -> None:
        """Save the state `SAVE_DELAY_S` from now, with every change made until then."""
        if self._store is None or self._persist_soon:
            return
        self._persist_soon = True
        self._save_timer = asyncio.get_running_loop().call_later(SAVE_DELAY_S, self._save)

    def restore(self) -> PersistedState | None:
        """Reinstate the saved tenants, leases, resumes, tokens, parked memory, accounting and
        the fair policy's lags; what was saved (None without a store)."""
        if self._store is None:
            return None
        saved = self._store.load()
        try:
            self._refuse_unrestorable(saved.parked)
        except RecordError as err:
            raise _unreadable(saved, err) from None
        self.metrics.accounting.load(saved.accounting)
        self.tenants.restore(saved.tenants)
        if self.table.fair is not None:
            fairsave.restore(self.table.fair, saved.fair, self.tenants.tenants)
            self.table.fair_home = {lag.tenant_id: lag.gpus for lag in saved.fair.tenants}
        if self.forget_departed_after > 0:
            self.metrics.accounting.mark_unknown_departed(set(self.tenants.tenants), self.clock())
        for gpu, token in saved.tokens.items():
            self.table.gpu(gpu).token = token
        for lease in saved.leases:
            tenant = self.tenants.tenants.get(lease.tenant_id)
            if tenant is not None:  # the fair policy charges the turn and orders it by these
                usage = TenantUsage(duty=tenant.gpu_duty, tier=tenant.priority)
                self.table.usage[lease.tenant_id] = usage
            self.metrics.restored(lease.lease_id, self.table.restore_lease(lease))
        queued = self.resumes.restore(self.table, saved.resumes.values(), self.tenants.tenants)
        self.resumes.restore_given(self.table, saved.given)
        saved.resumes = {r.waiter_id: r for r in queued}
        self.unclaimed = {lease.lease_id for lease in saved.leases}
        try:
            self.preparer.reinstate(saved.parked)
        except RecordError as err:
            raise _unreadable(saved, err) from None
        for lease in saved.leases:  # its holder may allocate until it yields
            self.preparer.held(lease.tenant_id, lease.gpus)
        return saved

    def _refuse_unrestorable(self, parked: dict[str, Any]) -> None:
        """`StateDirError` if the state holds memory parked by a method this agent lacks (a
        restart with another `--backend`): started, it would give those tenants turns on memory
        still parked and forget it at its next snapshot."""
        assert self._store is not None
        offered = self.parking.methods() if self.parking is not None else ()
        lost = {m: sorted(r) for m, r in records_by_method(parked).items() if m not in offered}
        if lost:
            held = "; ".join(f"by {m}: {', '.join(tenants)}" for m, tenants in lost.items())
            raise StateDirError(
                f"{self._store.path} holds memory parked {held}, which this agent cannot "
                f"restore (it parks with {', '.join(offered) or 'nothing'}); restart it with "
                f"{', '.join(lost)} among --backend, or move it and {self._store.journal_path.name}"
                " aside to forget that memory"
            )

    def _save(self) -> None:
        self._persist_soon, self._save_timer = False, None
        assert self._store is not None
        self.metrics.accounting.fold(self.clock(), self.forget_departed_after)
        self._store.save_soon(
            PersistedState(
                tenants=list(self.tenants.tenants.values()),
                leases=list(self.table.leases.values()),
                resumes=self.resumes.snapshot(self.table),
                given=self.resumes.given_back(self.table),
                tokens={gpu: state.token for gpu, state in self.table.gpus.items()},
                parked=self.preparer.durable(),
                accounting=self.metrics.accounting.to_json(),
                fair=self._fair_lags(),
            )
        )

    def _fair_lags(self) -> fairsave.FairLags:
        """The fair policy's state to keep (empty under another policy)."""
        registered = {t.tenant_id: (t.gpus, t.priority) for t in self.tenants.tenants.values()}
        return fairsave.lags_of_table(self.table, registered)


def _unreadable(saved: PersistedState, err: RecordError) -> StateDirError:
    """The saved record of parked memory is of another shape: one line naming where it is."""
    return StateDirError(
        f"cannot read {saved.parked_from}: its record of parked memory is not one this agent "
        f"wrote ({err}); move it aside to start afresh, forgetting what it holds parked"
    )


class _GrantsFirst:
    """`TurnState.grants_first`'s block (a class, not a generator: it is on every handoff)."""

    def __init__(self, state: TurnState) -> None:
        self._state = state
        self._depth = 0

    def __enter__(self) -> None:
        if self._depth == 0:
            self._state._after = []
        self._depth += 1

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            after, self._state._after = self._state._after or [], None
            for step in after:
                step()
