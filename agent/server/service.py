"""The lease service: turns (`agent.server.turns`) plus tenants, sessions and agent restarts.

No sockets here: `agent.server.grpc_server` turns RPCs into calls on `LeaseService`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from agent.core import events as ev
from agent.core.errors import Quarantined, TenantGone
from agent.core.leases import Lease, LeaseTable
from agent.core.residency import TurnPreparer
from agent.node.state import StateStore
from agent.node.tenants import POD, Tenant
from agent.parking.backends.base import TenantRef
from agent.parking.host import Parking, ParkingHost, parking_of
from agent.parking.methods import parks_itself
from agent.server.accounting import AccountingCollector
from agent.server.metrics import AgentMetrics
from agent.server.sessions import SessionRegistry
from agent.server.turns import Granted, TurnService, lease_to_pb
from baton._pb import agent_pb2 as pb
from baton.contract.names import MIB

__all__ = ["Granted", "LeaseService", "PreparerFactory", "lease_to_pb", "tenant_ref"]

log = logging.getLogger(__name__)

_NAMES_METHOD = frozenset({ev.TENANT_JOINED, ev.QUEUED, ev.GRANTED})
"""Events whose detail also names the tenant's parking method (`parking app`)."""

PreparerFactory = Callable[[ParkingHost], TurnPreparer]
"""Builds the service's residency layer, given the service as its `ParkingHost`."""


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


class LeaseService(TurnService):
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
    ) -> None:
        self._left_app_pods: set[str] = set()
        """Pod tenants that parked themselves (`app`) and whose last session ended: their memory
        lived in their processes, so nothing of theirs counts until a session opens again."""
        built = preparer(self)
        self.parking: Parking | None = parking_of(built)
        super().__init__(
            table=table,
            preparer=built,
            clock=clock,
            store=store,
            metrics=metrics,
            reconnect_grace=reconnect_grace,
            policy_name=policy_name,
            sessions=sessions,
        )
        self.metrics.tier_of = lambda t: u.tier if (u := table.usage.get(t)) else 0
        collector = AccountingCollector(self.metrics.accounting, lambda: self.account())
        self.metrics.registry.register(collector)

    def account(self) -> None:
        """Bring the parked byte-seconds up to now (before they are read or saved)."""
        residency = self.preparer.status().get("tenants") or {}
        parked = {t: int(e.get("parked_bytes") or 0) for t, e in residency.items()}
        tiers = {t: u.tier for t, u in self.table.usage.items()}
        self.metrics.accounting.parked(self._clock(), parked, tiers)

    def tenant_refs(self) -> dict[str, TenantRef]:
        """The tenants that count for parking, as the preparer reads them."""
        parks = self.sessions.parks_itself
        return {
            t.tenant_id: tenant_ref(t, parks(t.tenant_id))
            for t in list(self.tenants.tenants.values())
            if t.tenant_id not in self._left_app_pods
        }

    def parking_method(self, tenant_id: str) -> str:
        """The method that parks the tenant; empty where the node parks nobody."""
        tenant = self.tenants.tenants.get(tenant_id)
        if tenant is None or self.parking is None:
            return ""
        ref = tenant_ref(tenant, self.sessions.parks_itself(tenant_id))
        return self.parking.method_for(ref)

    def _publish(
        self,
        kind: str,
        tenant_id: str,
        *,
        lease: Lease | None = None,
        gpus: tuple[str, ...] = (),
        detail: str = "",
    ) -> None:
        """A tenant's joining, queueing and grants also name its method: `pod; parking app`."""
        method = self.parking_method(tenant_id) if kind in _NAMES_METHOD else ""
        if method:
            detail = f"{detail}; parking {method}" if detail else f"parking {method}"
        super()._publish(kind, tenant_id, lease=lease, gpus=gpus, detail=detail)

    def load(self) -> None:
        """Reinstate persisted tenants and leases; holders have `reconnect_grace` to come back."""
        if self._store is None:
            return
        saved = self._store.load()
        self.metrics.accounting.load(saved.accounting)
        self.tenants.restore(saved.tenants)
        for gpu, token in saved.tokens.items():
            self.table.gpu(gpu).token = token
        for lease in saved.leases:
            self.table.restore_lease(lease)
        self.preparer.reinstate(saved.parked)
        if saved.tenants:
            log.info(
                "restored %d tenants and %d leases (%d turns granted or ended after the "
                "snapshot, from the journal); holders have %g s to reconnect",
                len(saved.tenants),
                len(saved.leases),
                saved.replayed,
                self._grace,
            )
            asyncio.get_running_loop().call_later(self._grace, self._end_grace)

    def _check_session(self, tenant_id: str) -> None:
        if self.table.leases_of(tenant_id) and not self.sessions.connected(tenant_id):
            log.warning("tenant %s holds a turn but never opened a session", tenant_id)
            self._drop(tenant_id, "it held a turn without an open session")

    def _end_grace(self) -> None:
        for tenant in list(self.tenants.tenants.values()):
            if not self.sessions.connected(tenant.tenant_id):
                log.info("tenant %s did not reconnect within the grace period", tenant.tenant_id)
                self._drop(tenant.tenant_id, "did not reconnect after an agent restart")

    # Tenants.

    def register(self, pid: int, uid: int, request: pb.RegisterRequest) -> Tenant:
        """Register a local tenant's process."""
        tenant = self.tenants.register_local(
            pid=pid,
            uid=uid,
            name=request.name,
            gpus=request.gpus,
            gpu_memory_mib=request.gpu_memory_mib,
            gpu_duty=request.gpu_duty or 100,
            memory_limit_bytes=request.memory_limit_bytes,
            priority=request.priority,
        )
        for gpu in tenant.gpus:
            self.table.gpu(gpu)
        self._publish(ev.TENANT_JOINED, tenant.tenant_id, gpus=tenant.gpus, detail=f"pid {pid}")
        self._changed()
        return tenant

    def session_opened(self, tenant_id: str, pid: int) -> None:
        """A tenant process opened its session: its processes are found again before a move."""
        self._left_app_pods.discard(tenant_id)
        self.preparer.rescan(tenant_id)
        self._publish(ev.CONNECTED, tenant_id, detail=f"pid {pid}")

    def quarantine(self, tenant_id: str, why: str) -> None:
        """The tenant's memory can no longer be moved safely: it takes no more turns."""
        self._publish(ev.QUARANTINED, tenant_id, detail=why)
        error = Quarantined(f"{tenant_id} takes no more turns: {why}")
        for waiter in [w for w in self.table.waiters.values() if w.tenant_id == tenant_id]:
            self.table.cancel(waiter.waiter_id)
            self._fail(waiter.waiter_id, error)
        self._changed()

    def session_closed(self, tenant_id: str, pid: int, last: bool) -> None:
        """A tenant process's session ended (it exited or died, or the agent is stopping)."""
        if self.stopping:  # keep the tenant and its turn for the next agent
            return
        self._publish(ev.DISCONNECTED, tenant_id, detail=f"pid {pid}")
        self.tenants.drop_pid(tenant_id, pid)
        if last:
            tenant = self.tenants.tenants.get(tenant_id)
            # A pod outlives its processes; one that parked itself has nothing left to park (the
            # driver freed its process's memory) and nobody left to ask.
            pod = tenant is not None and tenant.source == POD
            if pod and parks_itself(self.parking_method(tenant_id)):
                self._left_app_pods.add(tenant_id)
            why = "its last session ended"
            if pod:  # the pod is still on the node: listed, with no process, until it leaves
                why += "; its pod stays listed, with no process, until it leaves the node"
            self._drop(tenant_id, why)

    def upsert_pod(self, tenant: Tenant) -> None:
        """A pod on this node with Baton GPUs appeared or changed."""
        self.upsert_tenant(tenant, "pod")

    def upsert_tenant(self, tenant: Tenant, detail: str) -> None:
        """A tenant known by other means than a registration (a pod, an llm-d job) changed."""
        old = self.tenants.tenants.get(tenant.tenant_id)
        self.tenants.upsert_pod(tenant)
        if old is not None and old.to_json() == tenant.to_json():
            return
        for gpu in tenant.gpus:
            self.table.gpu(gpu)
        self._publish(ev.TENANT_JOINED, tenant.tenant_id, gpus=tenant.gpus, detail=detail)
        self._changed()

    def pod_gone(self, tenant_id: str) -> None:
        """The tenant's pod left the node."""
        self._drop(tenant_id, "its pod left the node")
        self.tenants.remove(tenant_id)
        self._left_app_pods.discard(tenant_id)

    def _drop(self, tenant_id: str, why: str) -> None:
        leases, waiters = self.table.drop_tenant(tenant_id)
        for waiter in waiters:
            self._fail(waiter.waiter_id, TenantGone(f"tenant {tenant_id} left: {why}"))
        for lease in leases:
            self._journal_end(lease)
            self.metrics.released(lease, self._clock())
        tenant = self.tenants.tenants.get(tenant_id)
        if tenant is not None and tenant.source != POD:
            self.tenants.remove(tenant_id)
        self._publish(ev.TENANT_GONE, tenant_id, detail=why)
        log.info("tenant %s: %s; released %d leases", tenant_id, why, len(leases))
        self._spawn(self.preparer.forget(tenant_id))
        self._changed()
