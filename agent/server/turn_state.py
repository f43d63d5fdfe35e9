"""What the turn service holds (table, tenants, sessions, events, metrics, the state store) and
how it publishes events, persists the state and runs background work."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from agent.core import events as ev
from agent.core.ahead import LookAhead
from agent.core.leases import Lease, LeaseTable
from agent.core.residency import TurnPreparer
from agent.node.state import PersistedState, StateStore
from agent.node.tenants import TenantRegistry
from agent.server.metrics import AgentMetrics
from agent.server.revocations import Revocations
from agent.server.sessions import SessionRegistry


@dataclass
class Granted:
    """What an acquire returns: the lease and how long the tenant waited."""

    lease: Lease
    waited: float


class TurnState:
    """The turn service's state and plumbing; `TurnService` adds the turns themselves."""

    def __init__(
        self,
        *,
        table: LeaseTable,
        preparer: TurnPreparer,
        clock: Callable[[], float],
        store: StateStore | None = None,
        metrics: AgentMetrics | None = None,
        reconnect_grace: float = 10.0,
        policy_name: str = "fifo",
        sessions: SessionRegistry | None = None,
    ) -> None:
        self.table = table
        self.policy_name = policy_name
        self.preparer = preparer
        self.tenants = TenantRegistry()
        self.sessions = sessions or SessionRegistry()
        self.events = ev.EventBus()
        self.metrics = metrics or AgentMetrics()
        self._clock = clock
        self._store = store
        self._grace = reconnect_grace
        self._pending: dict[str, asyncio.Future[Lease]] = {}
        self._on_grant: dict[str, Callable[[Lease], None]] = {}
        """Waiter id → who hears of its grant as it is made (`TurnService.acquire`)."""
        self.revocations = Revocations()
        self._resumes: dict[str, str] = {}
        """Revoked lease id → the waiter (then lease) that gives its tenant the turn back."""
        self._changes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._ahead = LookAhead(preparer, self._spawn)
        self.stopping = False
        self._persist_soon = False
        self._persist_asked = False
        """`persist()` was called and its step has not run yet (close saves then too)."""
        self._settle_pending = False
        self._closed = False

    # Lifecycle.

    async def close(self) -> None:
        """Stop timers and background work; the persisted state stays as it is."""
        self.stopping = True
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for task in list(self._tasks):
            task.cancel()
        if self._store is not None and (self._persist_soon or self._persist_asked):
            self._save()
        if self._store is not None:
            self._store.flush()
            self._store.close()

    # Plumbing.

    def persist(self) -> None:
        """Save the state soon (e.g. after the residency layer moved memory): in the next
        event-loop step, after a grant those moves made room for has reached its tenant."""
        self._persist_asked = True
        asyncio.get_running_loop().call_soon(self._persist)

    def _fail(self, waiter_id: str, error: Exception) -> None:
        self._on_grant.pop(waiter_id, None)
        future = self._pending.pop(waiter_id, None)
        if future is not None and not future.done():
            future.set_exception(error)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _publish(
        self,
        kind: str,
        tenant_id: str,
        *,
        lease: Lease | None = None,
        gpus: tuple[str, ...] = (),
        detail: str = "",
    ) -> None:
        self.events.publish(
            ev.Event(
                kind=kind,
                tenant_id=tenant_id,
                at=self._clock(),
                gpus=lease.gpus if lease else gpus,
                lease_id=lease.lease_id if lease else "",
                tokens=dict(lease.tokens) if lease else {},
                detail=detail,
            )
        )

    def _journal_grant(self, lease: Lease) -> None:
        """The grant is on disk before anyone hears of it (`agent.node.state`)."""
        if self._store is not None:
            self._store.record_grant(lease)

    def _journal_end(self, lease: Lease) -> None:
        if self._store is not None:
            self._store.record_end(lease.lease_id)

    def _persist(self) -> None:
        """Save the state once this event-loop step's changes are all made."""
        self._persist_asked = False
        if self._store is not None and not self._persist_soon:
            self._persist_soon = True
            asyncio.get_running_loop().call_soon(self._save)

    def _save(self) -> None:
        self._persist_soon = False
        assert self._store is not None
        self._store.save_soon(
            PersistedState(
                tenants=list(self.tenants.tenants.values()),
                leases=list(self.table.leases.values()),
                tokens={gpu: state.token for gpu, state in self.table.gpus.items()},
                parked=self.preparer.durable(),
                accounting=self.metrics.accounting.to_json(),
            )
        )
