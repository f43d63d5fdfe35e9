"""The lease service: one object that wires the turn service's three parts and is what the
rest of the agent calls.

- `agent.server.turn_state.TurnState`: what the service holds (table, tenants, sessions,
  events, metrics), its events, its persistence and its background tasks;
- `agent.server.turns.Turns`: acquire, yield, grants, revocation and timeouts, on that state;
- `agent.server.tenancy.Tenancy`: who joins, whose sessions open and close, who leaves, who
  comes back after a restart; it admits and drops tenants through `Turns`.

No sockets here: `agent.server.grpc_server` turns RPCs into calls on `LeaseService`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from agent.core.errors import AcquireTimeout
from agent.core.leases import Lease, LeaseTable
from agent.core.residency import TurnPreparer
from agent.node.state import StateStore
from agent.node.tenants import LOCAL, Tenant
from agent.parking.backends.base import TenantRef
from agent.parking.host import ParkingHost
from agent.server.accounting import AccountingCollector
from agent.server.metrics import AgentMetrics
from agent.server.sessions import SessionRegistry
from agent.server.tenancy import Tenancy
from agent.server.turn_state import Granted, TurnState, tenant_ref
from agent.server.turns import Answer, Turns, lease_to_pb
from baton._pb import agent_pb2 as pb

__all__ = ["Granted", "LeaseService", "PreparerFactory", "lease_to_pb", "tenant_ref"]


class JobGate(Protocol):
    """Where a job's member pod's own acquire and yield go (`agent.server.coordinated`)."""

    def job_of(self, tenant: Tenant, asked: str) -> str: ...

    async def join(self, tenant: Tenant, job: str, timeout: float | None) -> Lease: ...

    def holds(self, tenant: Tenant, lease_id: str) -> bool: ...

    def leave(self, tenant: Tenant, lease_id: str) -> float: ...

    def session_ended(self, tenant_id: str) -> None: ...


PreparerFactory = Callable[[ParkingHost], TurnPreparer]
"""Builds the service's residency layer, given the service as its `ParkingHost`."""


class LeaseService:
    """Turn-taking on the node's GPUs, for the tenants the agent knows.

    It is the `ParkingHost` of its preparer, which `preparer` builds with it at construction;
    `parking` is that preparer as a `Parking`, or None where the node parks nothing.
    """

    def __init__(
        self,
        *,
        table: LeaseTable,
        preparer: PreparerFactory,
        clock: Callable[[], float],
        store: StateStore | None = None,
        metrics: AgentMetrics | None = None,
        reconnect_grace: float = 10.0,
        policy_name: str = "fifo",
        sessions: SessionRegistry | None = None,
        forget_departed_after: float = 3600.0,
    ) -> None:
        # The preparer keeps this service as its host and asks it nothing until it runs.
        self.state = TurnState(
            table=table,
            preparer=preparer(self),
            clock=clock,
            store=store,
            metrics=metrics,
            reconnect_grace=reconnect_grace,
            sessions=sessions,
            forget_departed_after=forget_departed_after,
        )
        self.turns = Turns(
            self.state, unwatched=lambda tenant_id: self.tenancy.unwatched(tenant_id)
        )
        self.tenancy = Tenancy(self.state, self.turns)
        self.table = table
        self.preparer = self.state.preparer
        self.parking = self.state.parking
        self.tenants = self.state.tenants
        self.sessions = self.state.sessions
        self.events = self.state.events
        self.metrics = self.state.metrics
        self.policy_name = policy_name
        self.revocations = self.turns.revocations
        self.jobs: JobGate | None = None
        """With a coordinator: member pods' acquires take their job's cluster-wide turn."""
        self.metrics.tier_of = lambda t: u.tier if (u := table.usage.get(t)) else 0
        collector = AccountingCollector(self.metrics.accounting, self.state.account)
        self.metrics.registry.register(collector)

    @property
    def stopping(self) -> bool:
        """The agent is stopping: sessions that end now keep their tenants and turns."""
        return self.state.stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self.state.stopping = value

    async def close(self) -> None:
        """Stop timers and background work; the persisted state stays as it is."""
        self.turns.close()
        self.tenancy.close()
        await self.state.close()

    def load(self) -> None:
        """Reinstate persisted tenants and leases; holders have `reconnect_grace` to come back."""
        self.tenancy.load()

    def account(self) -> None:
        """Bring the parked byte-seconds up to now (before they are read or saved)."""
        self.state.account()

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
        """Wait for the turn on `gpus` (all of the tenant's GPUs if empty); see `Turns.acquire`."""
        return await self.turns.acquire(tenant, gpus, timeout, on_grant, handed, revoked)

    def expire(self, waiter_id: str, error: AcquireTimeout, why: str) -> None:
        """A waiter whose deadline its caller keeps (`agent.server.llmd.asking`) leaves the
        queue as one past its deadline does: its acquire raises `error`, `expired` says `why`."""
        waiter = self.table.cancel(waiter_id)
        if waiter is not None:
            self.turns.expire(waiter, error, why)
            self.turns.changed()

    def yield_(self, tenant: Tenant, lease_id: str, answer: Answer = None, ago: float = 0) -> float:
        """End the tenant's turn (its caller's `ago` seconds ago: a kept turn's); returns how
        long it held it; see `Turns.yield_`."""
        return self.turns.yield_(tenant, lease_id, answer, ago)

    def not_restored(self, tenant: Tenant, parked: Mapping[str, int]) -> None:
        """The tenant ends a turn with this memory still parked in its process (GPU → bytes):
        its parking method counts it parked again (its own word, on its own memory only)."""
        if parked and self.state.parking is not None:
            self.state.parking.not_restored(tenant.tenant_id, parked)

    def parked_at_yield(self, tenant: Tenant, lease_id: str, parked: Mapping[str, int]) -> None:
        """The tenant's process parked this memory itself as its turn `lease_id` ended (GPU →
        bytes), as the agent asked (`agent.server.yield_parks`): counted parked before the next
        grant; only on the GPUs of that turn, while it is the tenant's."""
        lease = self.table.leases.get(lease_id)
        if lease is None or lease.tenant_id != tenant.tenant_id or self.state.parking is None:
            return  # the yield fails, or ends nothing: the next grant reads the node
        mine = {gpu: size for gpu, size in parked.items() if gpu in lease.gpus}
        if mine:
            self.state.parking.parked_at_yield(tenant.tenant_id, mine)

    def give_up_resume(self, tenant: Tenant, gpus: Sequence[str]) -> bool:
        """The tenant yields the turn on `gpus` the node revoked and has yet to give back: it is
        not given back (`Turns.cancel_resume`); whether one waited."""
        return self.turns.cancel_resume(tenant.tenant_id, gpus)

    def inspect(self, tenant: Tenant, lease_id: str) -> Lease:
        """One of the tenant's own leases (renewing it is the same check)."""
        return self.turns.inspect(tenant, lease_id)

    # Tenants.

    async def register(self, pid: int, uid: int, request: pb.RegisterRequest) -> Tenant:
        """Register a local tenant's process; a tenant of its name that left goes first
        (`forgotten`)."""
        await self.tenancy.forgotten(f"{LOCAL}/{request.name}")
        return self.tenancy.register(pid, uid, request)

    def session_opened(self, tenant_id: str, pid: int) -> None:
        """A tenant process opened its session: its processes are found again before a move,
        what its holders may keep is told again (`agent.server.kept_turns`), and a turn given
        back to it while it had no session is told, or its resume tried (after a restart)."""
        self.tenancy.session_opened(tenant_id, pid)
        if self.turns.resumes.reconnected(tenant_id, self.table, self.sessions):
            self.turns.changed()
        else:
            self.turns.retell()

    def session_closed(self, tenant_id: str, pid: int, last: bool) -> None:
        """A tenant process's session ended (it exited or died, or the agent is stopping)."""
        self.tenancy.session_closed(tenant_id, pid, last)
        if self.jobs is not None and not self.stopping:
            self.jobs.session_ended(tenant_id)

    def left(self, tenant_id: str, why: str) -> None:
        """A tenant (not a pod) whose departure no session tells is taken to have left (`why`):
        its turns and waits end, its accounting and fair debt are a departed tenant's."""
        self.tenancy.left(tenant_id, why)

    async def forgotten(self, tenant_id: str) -> None:
        """Return once a tenant of this id that left is forgotten by the residency layer (a
        tenant joining under its id waits for that)."""
        await self.tenancy.forgotten(tenant_id)

    def upsert_pod(self, tenant: Tenant) -> None:
        """A pod on this node with Baton GPUs appeared or changed."""
        self.tenancy.upsert_tenant(tenant, "pod")

    def upsert_tenant(self, tenant: Tenant, detail: str) -> None:
        """A tenant known by other means than a registration (a pod, an llm-d job) changed."""
        self.tenancy.upsert_tenant(tenant, detail)

    def pod_gone(self, tenant_id: str) -> None:
        """The tenant's pod left the node."""
        self.tenancy.pod_gone(tenant_id)

    # The preparer's host (`agent.parking.host.ParkingHost`).

    def tenant_refs(self) -> dict[str, TenantRef]:
        """The tenants that count for parking, as the preparer reads them."""
        return self.tenancy.tenant_refs()

    def quarantine(self, tenant_id: str, why: str) -> None:
        """The tenant's memory can no longer be moved safely: it takes no more turns."""
        self.tenancy.quarantine(tenant_id, why)

    def persist(self) -> None:
        """The residency layer moved memory or forgot a tenant: journal its parking record."""
        self.state.persist()
