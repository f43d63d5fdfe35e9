"""The tenants the agent knows: who joins (a registration, a pod, an llm-d job), whose sessions
open and close, who leaves, who is quarantined, and who comes back after an agent restart."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence

from agent.core import events as ev
from agent.core.errors import InvalidRegistration, Quarantined, TenantGone
from agent.node.peers import ProcessWatch
from agent.node.state_json import PersistedState
from agent.node.tenants import POD, Tenant
from agent.parking.backends.base import TenantRef
from agent.parking.methods import parks_itself
from agent.server.turn_state import TurnState, tenant_ref
from agent.server.turns import Turns
from baton._pb import agent_pb2 as pb

log = logging.getLogger(__name__)


class Tenancy:
    """Tenants and their sessions, admitted to and dropped from the turns of `turns`."""

    def __init__(self, state: TurnState, turns: Turns) -> None:
        self._state = state
        self._turns = turns
        self._left_app_pods: set[str] = set()
        """Pod tenants that parked themselves (`app`) and whose last session ended: their memory
        lived in their processes, so nothing of theirs counts until a session opens again."""
        self._refs: tuple[tuple[int, int, frozenset[str]], dict[str, TenantRef]] | None = None
        self._hearers: dict[str, set[int]] = {}
        """Tenant (not a pod) → its processes alive as its resume was withdrawn: only they can
        come back to hear so (`Resumes.withdrawn`), which is forgotten once they have exited."""
        self._watch: ProcessWatch | None = None
        self._forgetting: dict[str, asyncio.Task[None]] = {}
        """Tenant → the residency layer's `forget` of it, until that has run (it waits for the
        parking lock): a tenant of the same id joins only after it (`forgotten`)."""
        self._deferred: dict[str, tuple[Tenant, str]] = {}
        """Tenant → a pod (with its detail) that appeared under the id of a tenant that left,
        while that one is forgotten: it joins then (a StatefulSet's pod keeps its name)."""

    def close(self) -> None:
        """Stop watching the processes of tenants whose resume was withdrawn."""
        if self._watch is not None:
            self._watch.close()

    def tenant_refs(self) -> dict[str, TenantRef]:
        """The tenants that count for parking, as the preparer reads them: the same dict until
        the tenants, their processes or their sessions change (the preparer asks at every
        grant; do not change it)."""
        state = self._state
        drawn_from = (
            state.tenants.revision,
            state.sessions.revision,
            frozenset(self._left_app_pods),
        )
        if self._refs is None or self._refs[0] != drawn_from:
            self._refs = (drawn_from, self._draw_refs())
        return self._refs[1]

    def _draw_refs(self) -> dict[str, TenantRef]:
        parks = self._state.sessions.parks_itself
        return {
            t.tenant_id: tenant_ref(t, parks(t.tenant_id))
            for t in list(self._state.tenants.tenants.values())
            if t.tenant_id not in self._left_app_pods
        }

    # Agent restarts.

    def load(self) -> None:
        """Reinstate persisted tenants and leases; holders have `reconnect_grace` to come back."""
        saved = self._state.restore()
        if saved is not None and saved.tenants:
            log.info("%s", restored_line(saved, self._state.grace))
            asyncio.get_running_loop().call_later(self._state.grace, self._end_grace)

    def unwatched(self, tenant_id: str) -> None:
        """A tenant was granted a turn `reconnect_grace` ago; it goes if it never opened a
        session."""
        if self._state.table.leases_of(tenant_id) and not self._state.sessions.connected(tenant_id):
            log.warning("tenant %s holds a turn but never opened a session", tenant_id)
            self._withdraw(tenant_id, "the turn given back after its revocation is withdrawn")
            self._drop(tenant_id, "it held a turn without an open session")

    def _end_grace(self) -> None:
        for tenant in list(self._state.tenants.tenants.values()):
            if not self._state.sessions.connected(tenant.tenant_id):
                log.info("tenant %s did not reconnect within the grace period", tenant.tenant_id)
                self._withdraw(
                    tenant.tenant_id,
                    "the turn revoked before the agent restarted is not given back",
                )
                self._drop(tenant.tenant_id, "did not reconnect after an agent restart")

    def _withdraw(self, tenant_id: str, what: str) -> None:
        """Tell the tenant's next session `what` became of the turn it was to be given back."""
        grace = self._state.grace
        why = f"{what}: no session of {tenant_id} was open within --reconnect-grace ({grace:g} s)"
        self._withdraw_resume(tenant_id, why)

    def _withdraw_resume(self, tenant_id: str, why: str, pids: Iterable[int] = ()) -> None:
        """The tenant's next session hears `why` its resume is withdrawn, if one comes: a pod's
        until its pod leaves; another tenant's until its processes (and `pids`) have exited."""
        resumes, tenant = self._turns.resumes, self._state.tenants.tenants.get(tenant_id)
        resumes.withdraw(tenant_id, self._state.table, why)
        if tenant is None or tenant.source == POD or tenant_id not in resumes.withdrawn:
            return
        if self._watch is None:
            self._watch = ProcessWatch(asyncio.get_running_loop())
        watch = self._watch.watch
        alive = {p for p in {*tenant.pids, *pids} if p > 0 and watch(p, self._exited)}
        if alive:
            self._hearers[tenant_id] = alive
        else:
            self._unheard(tenant_id)

    def _exited(self, pid: int) -> None:
        for tenant_id, pids in list(self._hearers.items()):
            pids.discard(pid)
            if not pids:
                self._unheard(tenant_id)

    def _unheard(self, tenant_id: str) -> None:
        """No process of the tenant lives to hear its resume withdrawn: that is forgotten."""
        self._hearers.pop(tenant_id, None)
        if self._turns.resumes.withdrawn.pop(tenant_id, None) is not None:
            log.info("tenant %s: its withdrawn resume is forgotten (no process of it lives)",
                     tenant_id)  # fmt: skip

    # Tenants.

    def register(self, pid: int, uid: int, request: pb.RegisterRequest) -> Tenant:
        """Register a local tenant's process."""
        self._check_gpus(request.gpus)
        tenant = self._state.tenants.register_local(
            pid=pid,
            uid=uid,
            name=request.name,
            gpus=request.gpus,
            gpu_memory_mib=request.gpu_memory_mib,
            gpu_duty=request.gpu_duty or 100,
            memory_limit_bytes=request.memory_limit_bytes,
            priority=request.priority,
        )
        self._state.journal_tenant(tenant)
        self._state.tenant_back(tenant.tenant_id)
        for gpu in tenant.gpus:
            self._state.table.gpu(gpu)
        self._state.publish(
            ev.TENANT_JOINED, tenant.tenant_id, gpus=tenant.gpus, detail=f"pid {pid}"
        )
        self._turns.changed()
        return tenant

    def _check_gpus(self, gpus: Sequence[str]) -> None:
        """`InvalidRegistration` for GPUs the node does not have, where the agent knows its GPUs
        (a parking backend; `--backend none` takes any name)."""
        known = self._state.parking.gpu_memory if self._state.parking is not None else {}
        unknown = [gpu for gpu in gpus if known and gpu not in known]
        if unknown:
            raise InvalidRegistration(
                f"{', '.join(unknown)}: not a GPU of this node "
                f"(it has {', '.join(sorted(known))}); check BATON_GPUS"
            )

    def session_opened(self, tenant_id: str, pid: int) -> None:
        """A tenant process opened its session: its processes are found again before a move."""
        self._left_app_pods.discard(tenant_id)
        self._state.preparer.rescan(tenant_id)
        self._state.publish(ev.CONNECTED, tenant_id, detail=f"pid {pid}")

    def quarantine(self, tenant_id: str, why: str) -> None:
        """The tenant's memory can no longer be moved safely: it takes no more turns."""
        self._state.publish(ev.QUARANTINED, tenant_id, detail=why)
        error = Quarantined(f"{tenant_id} takes no more turns: {why}")
        table = self._state.table
        for waiter in [w for w in table.waiters.values() if w.tenant_id == tenant_id]:
            table.cancel(waiter.waiter_id)
            self._turns.fail(waiter.waiter_id, error)
        self._turns.changed()

    def session_closed(self, tenant_id: str, pid: int, last: bool) -> None:
        """A tenant process's session ended (it exited or died, or the agent is stopping)."""
        if self._state.stopping:  # keep the tenant and its turn for the next agent
            return
        self._state.publish(ev.DISCONNECTED, tenant_id, detail=f"pid {pid}")
        dropped = self._state.tenants.drop_pid(tenant_id, pid)
        left = self._state.tenants.tenants.get(tenant_id)
        # A restart does not count that process in; a non-pod's last one: `_drop` journals it gone.
        if dropped and left is not None and (not last or left.source == POD):
            self._state.journal_tenant(left)
        if last:
            tenant = self._state.tenants.tenants.get(tenant_id)
            # A pod outlives its processes; one that parked itself has nothing left to park (the
            # driver freed its process's memory) and nobody left to ask.
            pod = tenant is not None and tenant.source == POD
            if pod and parks_itself(self._state.parking_method(tenant_id)):
                self._left_app_pods.add(tenant_id)
            why = "its last session ended"
            if pod:  # the pod is still on the node: listed, with no process, until it leaves
                why += "; its pod stays listed, with no process, until it leaves the node"
            self._withdraw_resume(  # heard by its client if it was a blip: it reconnects
                tenant_id,
                f"the revoked turn is not given back: the last session of {tenant_id} ended "
                "while it waited (a tenant with no session leaves the queue)",
                [pid],
            )
            self._drop(tenant_id, why)

    def upsert_tenant(self, tenant: Tenant, detail: str) -> None:
        """A tenant known by other means than a registration (a pod, an llm-d job) changed; one
        of the id of a tenant that left joins once that one is forgotten (`forgotten`)."""
        old = self._state.tenants.tenants.get(tenant.tenant_id)
        if old is None and tenant.tenant_id in self._forgetting:
            if tenant.tenant_id not in self._deferred:
                log.info("tenant %s joins again: it waits until its departed namesake is "
                         "forgotten", tenant.tenant_id)  # fmt: skip
            self._deferred[tenant.tenant_id] = (tenant, detail)
            return
        self._state.tenants.upsert_pod(tenant)
        self._state.tenant_back(tenant.tenant_id)
        if old is not None and old.to_json() == tenant.to_json():
            return
        self._state.journal_tenant(tenant)
        for gpu in tenant.gpus:
            self._state.table.gpu(gpu)
        self._state.publish(ev.TENANT_JOINED, tenant.tenant_id, gpus=tenant.gpus, detail=detail)
        self._turns.changed()

    def left(self, tenant_id: str, why: str) -> None:
        """A tenant (not a pod) whose departure no session tells is taken to have left: an
        llm-d job whose callers cannot be watched, unseen for `--llmd-forget-idle-after`."""
        self._drop(tenant_id, why)

    def pod_gone(self, tenant_id: str) -> None:
        """The tenant's pod left the node."""
        if self._deferred.pop(tenant_id, None) and tenant_id not in self._state.tenants.tenants:
            return  # a pod that never joined: its namesake was still being forgotten
        self._drop(tenant_id, "its pod left the node")
        self._turns.resumes.withdrawn.pop(tenant_id, None)  # nobody of it comes back to hear it
        if self._state.tenants.remove(tenant_id) is not None:
            self._state.journal_gone(tenant_id)
        self._state.tenant_left(tenant_id)
        self._left_app_pods.discard(tenant_id)

    def _drop(self, tenant_id: str, why: str) -> None:
        state = self._state
        tier = state.metrics.tier_of(tenant_id)  # the table forgets it with the tenant
        known = state.tenants.tenants.get(tenant_id)
        placed = (known.gpus, known.priority) if known is not None else ((), 0)
        leases, waiters = state.table.drop_tenant(tenant_id, *placed)
        for waiter in waiters:
            self._turns.fail(waiter.waiter_id, TenantGone(f"tenant {tenant_id} left: {why}"))
        for lease in leases:
            state.journal_end(lease)
            state.metrics.released(lease, state.clock(), tier=tier)
        tenant = state.tenants.tenants.get(tenant_id)
        if tenant is not None and tenant.source != POD:
            state.tenants.remove(tenant_id)
            state.journal_gone(tenant_id)
            state.tenant_left(tenant_id)
        state.publish(ev.TENANT_GONE, tenant_id, detail=why)
        log.info("tenant %s: %s; released %d leases", tenant_id, why, len(leases))
        forget = state.spawn(state.preparer.forget(tenant_id))
        self._forgetting[tenant_id] = forget
        forget.add_done_callback(lambda done: self._forgot(tenant_id, done))
        self._turns.changed()

    def _forgot(self, tenant_id: str, forget: asyncio.Task[None]) -> None:
        if self._forgetting.get(tenant_id) is forget:
            del self._forgetting[tenant_id]
            joining = self._deferred.pop(tenant_id, None)
            if joining is not None and not forget.cancelled():  # not as the agent closes
                self.upsert_tenant(*joining)

    async def forgotten(self, tenant_id: str) -> None:
        """Return once what the residency layer kept of a tenant of this id that left is
        dropped: a tenant joining under the id of one that left must not start from that (its
        residency, parked memory, turn) nor have what it records then dropped with it."""
        forget = self._forgetting.get(tenant_id)
        if forget is not None:
            log.info("tenant %s joins again: it waits until its departed namesake is forgotten",
                     tenant_id)  # fmt: skip
            await asyncio.wait({forget})  # a move holds the parking lock: bounded by its deadline


def restored_line(saved: PersistedState, grace: float) -> str:
    """What an agent that restored `saved` logs (its tenants have `grace` seconds)."""
    resumes = len(saved.resumes)
    given = f", and {_count(resumes, 'revoked turn')} to give back" if resumes else ""
    tenants, leases = _count(len(saved.tenants), "tenant"), _count(len(saved.leases), "lease")
    replayed = _count(saved.replayed, "entry", "entries")
    return (
        f"restored {tenants} and {leases}{given} ({replayed} after the snapshot, from the "
        f"journal); each tenant has {grace:g} s to reconnect"
    )


def _count(n: int, one: str, many: str = "") -> str:
    return f"{n} {one}" if n == 1 else f"{n} {many or one + 's'}"
