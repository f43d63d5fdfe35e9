"""The real `TurnPreparer`: plans room for each turn and runs the moves through a backend.

Plans come from `agent.core.planner` (pure); this module gathers the snapshot, runs the moves off
the event loop (`asyncio.to_thread`), retries failed parks with backoff, and keeps metrics and the
per tenant status that /v1/status shows. One plan runs at a time per node. While a GPU is held,
`prepare_ahead` readies the tenant due next (`agent.core.planner.plan_ahead`), so that its grant
finds nothing left to move.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from agent.core.errors import Quarantined
from agent.core.planner import (
    NodeView,
    Plan,
    Reason,
    Refusal,
    Step,
    TenantView,
    plan_ahead,
    plan_park,
    plan_turn,
)
from agent.core.residency import NoRoom, TooLarge
from agent.parking.backends.base import (
    Backend,
    BackendError,
    BackendQuarantined,
    Move,
    Residency,
    TenantRef,
    TenantState,
    Unparkable,
)
from agent.parking.host import ParkingHost
from agent.parking.metrics import ParkingMetrics
from agent.parking.quarantine import Quarantines
from agent.parking.view import tenant_view

log = logging.getLogger(__name__)


class ParkingPreparer:
    """Makes each incoming tenant resident, parking least-recently-served ones when needed."""

    def __init__(
        self,
        backend: Backend,
        gpu_memory: Mapping[str, int],
        *,
        host_budget: int,
        headroom: int = 0,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        attempts: int = 3,
        backoff: float = 0.2,
        host: ParkingHost | None = None,
    ) -> None:
        self.backend = backend
        self.gpu_memory = dict(gpu_memory)
        self.host_budget = host_budget
        self.headroom = headroom
        self.metrics = ParkingMetrics(backend.name, registry, backend.methods())
        self.metrics.host_budget.set(host_budget)
        self._clock = clock
        self._wall = wall_clock
        self._attempts = attempts
        self._backoff = backoff
        self._lock = asyncio.Lock()
        self._refs: dict[str, TenantRef] = {}
        self._last_turn: dict[str, float] = {}
        self._last_turn_wall: dict[str, float] = {}
        self._holding: dict[str, frozenset[str]] = {}
        self._states: dict[str, TenantState] = {}
        self._waiting: dict[str, str] = {}
        self._ahead: dict[str, asyncio.Future[None]] = {}
        self._cgroups: dict[str, tuple[int | None, int]] = {}
        """Per tenant, its memory cgroup's limit and usage as the backend last read them."""
        self._host = host
        """The agent: only its tenants count, and it hears of quarantines and moves; None alone."""
        self.quarantines = Quarantines(self.metrics, host)

    def register(self, ref: TenantRef) -> None:
        """Learn a tenant's GPUs, PIDs, memory limit and declared footprint."""
        self._refs[ref.tenant_id] = ref
        self.backend.attach(ref)

    async def prepare(self, tenant_id: str, gpus: Sequence[str]) -> None:
        """Make `tenant_id` resident on its GPUs; raise `NoRoom` naming the numbers if not now."""
        ahead = self._ahead.get(tenant_id)
        if ahead is not None:  # its memory is on the way already: wait for that, move nothing
            await asyncio.wait({ahead})
        async with self._lock:
            if tenant_id not in self._refs:
                self.register(TenantRef(tenant_id, tuple(gpus)))
            for other, held in list(self._holding.items()):
                if held & set(gpus):
                    del self._holding[other]
            snap = await asyncio.to_thread(self._snapshot)
            self.quarantines.note_all(self._states)
            if tenant_id in self.quarantines.why:
                raise self._refuse_quarantined(tenant_id)
            plan = plan_turn(snap, tenant_id)
            await self._carry_out(tenant_id, plan, "grant")
            self._waiting.pop(tenant_id, None)
            self._holding[tenant_id] = frozenset(gpus)
            self._last_turn[tenant_id] = self._clock()
            self._last_turn_wall[tenant_id] = self._wall()

    async def prepare_ahead(
        self, tenant_id: str, gpus: Sequence[str], holders: Collection[str] = ()
    ) -> None:
        """Make the tenant due next resident while `holders` run; best effort, raises nothing."""
        if tenant_id in self._ahead:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ahead[tenant_id] = done
        try:
            async with self._lock:
                snap = await asyncio.to_thread(self._snapshot, holders)
                self.quarantines.note_all(self._states)
                if tenant_id in self.quarantines.why:
                    return
                plan = plan_ahead(snap, tenant_id)
                if isinstance(plan, Plan) and plan.steps:
                    log.info("preparing %s ahead of its turn", tenant_id)
                    await self._carry_out(tenant_id, plan, "ahead")
        except Exception as e:  # the grant will make room itself, and say why if it cannot
            log.warning("preparing %s ahead of its turn stopped: %s", tenant_id, e)
        finally:
            del self._ahead[tenant_id]
            done.set_result(None)

    async def settled(self) -> None:
        """Return once the moves started before this call (ahead ones included) are done."""
        if self._ahead:
            await asyncio.wait(list(self._ahead.values()))
        async with self._lock:
            pass

    async def revoke(self, tenant_id: str, gpus: Sequence[str]) -> None:
        """Park a holder whose lease ran out while others wait; `NoRoom` (it keeps its turn)
        if it must stay."""
        async with self._lock:
            self.metrics.preemptions.inc()
            held = self._holding.pop(tenant_id, None)
            try:
                snap = await asyncio.to_thread(self._snapshot)
                self.quarantines.note_all(self._states)
                if tenant_id not in snap.tenants:
                    return
                await self._carry_out(tenant_id, plan_park(snap, tenant_id), "revoke")
            except BaseException:
                if held is not None:
                    self._holding[tenant_id] = held
                raise

    async def park(self, tenant_id: str) -> None:
        """Park the tenant now, on request (llm-d's Snapshot); `NoRoom` if it cannot be."""
        async with self._lock:
            self._holding.pop(tenant_id, None)
            snap = await asyncio.to_thread(self._snapshot)
            if tenant_id in snap.tenants:
                await self._carry_out(tenant_id, plan_park(snap, tenant_id), "request")

    async def unpark(self, tenant_id: str) -> None:
        """Restore the tenant now, on request (llm-d's Restore), parking idle others for room."""
        async with self._lock:
            snap = await asyncio.to_thread(self._snapshot)
            if tenant_id in snap.tenants:
                await self._carry_out(tenant_id, plan_turn(snap, tenant_id), "request")

    def resident_bytes(self) -> dict[str, int]:
        """Device bytes in use on each GPU, as the backend counts them (`TenantState`)."""
        used = dict.fromkeys(self.gpu_memory, 0)
        for st in self._states.values():
            for gpu, where in st.residency.items():
                if where != Residency.PARKED:
                    used[gpu] = used.get(gpu, 0) + st.footprint_bytes.get(gpu, 0)
        return used

    async def forget(self, tenant_id: str) -> None:
        """Drop everything held for a tenant that is gone, parked bytes included."""
        async with self._lock:
            await asyncio.to_thread(self.backend.detach, tenant_id)
            for table in (self._refs, self._last_turn, self._last_turn_wall, self._holding):
                table.pop(tenant_id, None)
            self._cgroups.pop(tenant_id, None)
            self.quarantines.forget(tenant_id)
            self._states.pop(tenant_id, None)
            self._waiting.pop(tenant_id, None)
            self._publish()

    async def _carry_out(self, tenant_id: str, plan: Plan | Refusal, when: str) -> None:
        """Run the plan's moves in order, or record and raise the refusal."""
        if isinstance(plan, Refusal):
            raise self._refuse(tenant_id, plan.reason, plan.message)
        if not plan.steps:  # the snapshot the plan came from is current: nothing to re-read
            return
        try:
            for step in plan.steps:
                await self._move(tenant_id, step, when)
        finally:
            await asyncio.to_thread(self._refresh)
            self.quarantines.note_all(self._states)
            if self._host is not None:
                self._host.persist()

    async def _move(self, tenant_id: str, step: Step, when: str) -> Move:
        """One park or restore, retried with backoff; the tenant stays where it was on failure."""
        fn = self.backend.park if step.direction == "park" else self.backend.restore
        method = step.method or self.backend.method_of(step.tenant_id)
        log.info(
            "%s of %s on %s by %s starts (%d bytes)",
            step.direction, step.tenant_id, step.gpu, method, step.bytes,
        )  # fmt: skip
        for attempt in range(self._attempts):
            try:
                move = await asyncio.to_thread(fn, step.tenant_id, step.gpu)
            except (BackendQuarantined, Unparkable) as e:  # retrying cannot help
                self.metrics.failed(step.direction, method)
                log.error("%s of %s on %s: %s", step.direction, step.tenant_id, step.gpu, e)
                if isinstance(e, BackendQuarantined):
                    self.quarantines.note(step.tenant_id, str(e))
                if step.tenant_id == tenant_id and isinstance(e, BackendQuarantined):
                    raise self._refuse_quarantined(tenant_id) from e
                raise self._refuse(
                    tenant_id,
                    "quarantined" if isinstance(e, BackendQuarantined) else Reason.UNPARKABLE,
                    f"{step.direction} of {step.tenant_id} on {step.gpu} by {method} failed: {e}",
                ) from e
            except BackendError as e:
                if self._gone(step.tenant_id):  # it left meanwhile: forgotten, not moved
                    log.info("%s left during its %s: skipped", step.tenant_id, step.direction)
                    return Move(step.tenant_id, step.gpu, step.direction, 0, 0.0)
                self.metrics.failed(step.direction, method)
                log.warning(
                    "%s of %s on %s failed (attempt %d of %d): %s",
                    step.direction, step.tenant_id, step.gpu, attempt + 1, self._attempts, e,
                )  # fmt: skip
                if attempt + 1 == self._attempts:
                    raise self._refuse(
                        tenant_id,
                        "move_failed",
                        f"{step.direction} of {step.tenant_id} on {step.gpu} by {method} "
                        f"failed {self._attempts} times; last error: {e}",
                    ) from e
                await asyncio.sleep(self._backoff * 2**attempt)
            else:
                self.metrics.moved(move, when, method)
                log.info(
                    "%s %s on %s: %d bytes in %.3f s",
                    move.direction, move.tenant_id, move.gpu, move.bytes, move.seconds,
                )  # fmt: skip
                return move
        raise AssertionError("unreachable")

    def _gone(self, tenant_id: str) -> bool:
        """True when the host no longer counts the tenant (its last session ended)."""
        return self._host is not None and tenant_id not in self._host.tenant_refs()

    def _refuse(self, tenant_id: str, reason: str, message: str) -> NoRoom:
        """Count, log (once per new message) and show why `tenant_id` waits; the error to raise."""
        self.metrics.refused.labels(reason).inc()
        if self._waiting.get(tenant_id) != message:
            log.warning("turn for %s waits: %s", tenant_id, message)
        self._waiting[tenant_id] = message
        return TooLarge(message) if reason == Reason.TOO_LARGE else NoRoom(message)

    def _refuse_quarantined(self, tenant_id: str) -> Quarantined:
        """The error for a turn of a quarantined tenant; counted and shown like a refusal."""
        why = self.quarantines.why[tenant_id]
        self._refuse(tenant_id, "quarantined", f"{tenant_id} takes no more turns: {why}")
        return Quarantined(f"{tenant_id} takes no more turns: {why}")

    def rescan(self, tenant_id: str) -> None:
        """A session opened: the backend finds the tenant's processes again on next use."""
        self.backend.rescan(tenant_id)

    def durable(self) -> dict[str, Any]:
        """The backend's record of parked processes, for the agent's state file."""
        return self.backend.durable()

    def reinstate(self, saved: dict[str, Any]) -> None:
        """Hand the record saved before a restart back to the backend (it confirms it)."""
        if "methods" in saved and self.backend.methods() == (self.backend.name,):
            saved = saved["methods"].get(self.backend.name) or {}  # one method of several before
        if saved:
            self.backend.adopt(saved)

    def _tenant_ids(self) -> list[str]:
        """Tenants that count: the host's, else every one registered or in the backend.

        A tenant the host has dropped no longer counts, even before `forget` has run.
        """
        if self._host is None:
            return sorted(set(self._refs) | set(self.backend.tenants()))
        refs = self._host.tenant_refs()
        for tenant_id, ref in refs.items():
            if self._refs.get(tenant_id) != ref:
                self.register(ref)
        return sorted(refs)

    def _view(self, tenant_id: str, st: TenantState, busy: Collection[str] = ()) -> TenantView:
        """The planner's view of one tenant from the backend's state and what we know."""
        return tenant_view(
            st,
            self._refs.get(tenant_id),
            method=st.method or self.backend.method_of(tenant_id),
            gpu_memory=self.gpu_memory,
            last_turn=self._last_turn.get(tenant_id, float("-inf")),
            busy=tenant_id in self._holding or tenant_id in busy,
            cgroup=self._cgroups.get(tenant_id, (None, 0)),
        )

    def _snapshot(self, busy: Collection[str] = ()) -> NodeView:
        """The node as the backend reports it now, `busy` holding turns (in a worker thread)."""
        self._refresh()
        views = {t: self._view(t, st, busy) for t, st in self._states.items()}
        return NodeView(self.gpu_memory, views, self.headroom, self.host_budget)

    def _refresh(self) -> None:
        """Re-read every tenant's state and memory cgroup from the backend (in a worker thread)."""
        ids = self._tenant_ids()
        self._states = {t: self.backend.state(t) for t in ids}
        self._cgroups = {
            t: (self.backend.memory_limit(t), self.backend.memory_used(t)) for t in ids
        }
        self._publish()

    def _publish(self) -> None:
        self.metrics.parked_bytes.set(sum(st.parked_bytes for st in self._states.values()))

    def status(self) -> dict[str, Any]:
        """Node and per tenant residency for /v1/status."""
        tenants = {}
        for tenant_id, st in sorted(self._states.items()):
            view = self._view(tenant_id, st)
            kinds = set(st.residency.values())
            when = self._last_turn_wall.get(tenant_id)
            entry: dict[str, Any] = {
                "residency": kinds.pop().value if len(kinds) == 1 else "mixed" if kinds else "none",
                "gpus": {g: r.value for g, r in sorted(st.residency.items())},
                "footprint_bytes": sum(st.footprint_bytes.values()),
                "parked_bytes": st.parked_bytes,
                "method": st.method or self.backend.method_of(tenant_id),
                "last_turn": dt.datetime.fromtimestamp(when, dt.UTC).isoformat() if when else None,
            }
            if view.cgroup_blocks_park():
                entry["not_parkable"] = (
                    f"memory limit {view.memory_limit} bytes cannot hold its "
                    f"{sum(view.footprint.values())} bytes of GPU memory on top of the "
                    f"{view.memory_used} bytes it uses"
                )
            if st.unparkable:
                entry["not_parkable"] = st.unparkable
            quarantined = st.quarantined or self.quarantines.why.get(tenant_id)
            if quarantined:  # its memory is wherever the driver left it: not "resident"
                entry["residency"] = "quarantined"
                entry["quarantined"] = quarantined
            if st.pids:
                entry["pids"] = list(st.pids)
            if st.detail:
                entry["detail"] = st.detail
            if tenant_id in self._waiting:
                entry["waiting"] = self._waiting[tenant_id]
            tenants[tenant_id] = entry
        return {
            "backend": self.backend.name,
            "methods": list(self.backend.methods()),
            "parked_bytes": sum(st.parked_bytes for st in self._states.values()),
            "host_memory_budget_bytes": self.host_budget,
            "headroom_bytes": self.headroom,
            "tenants": tenants,
        }
