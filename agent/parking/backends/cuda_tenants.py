"""The tenants the cuda backend knows (`agent.parking.backends.cuda`): how their processes with
CUDA state are found, what those hold on each GPU and under which memory cgroup, and which
tenants are parked, refused or quarantined, and why.

A tenant's processes are its registered PIDs plus, for a pod, every process in the pod's cgroup;
those with CUDA state count. They are found again whenever what was found is older than
`REDISCOVER_S` or empty. A process whose state query fails counts as the tenant's (NVML measures
it) and keeps the tenant from being parked until a later query answers; one whose query does not
return quarantines the tenant, and its driver is not asked again. Every driver and NVML call runs
outside the lock that guards the tables.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.parking.backends import cuda_moves, procs
from agent.parking.backends.base import (
    BackendError,
    BackendQuarantined,
    Residency,
    TenantRef,
    TenantState,
)
from agent.parking.backends.cuda_driver import (
    CHECKPOINTED,
    FAILED,
    LOCKED,
    NOT_SUPPORTED,
    RUNNING,
    CheckpointDriver,
    DriverError,
    nvml_error,
)
from agent.parking.backends.cuda_moves import ParkedProcs
from agent.parking.backends.deadline import CallStalled, call_with_deadline

STALLED = "the driver may be wedged for this tenant's processes"
UNKNOWN = -1
"""The state of a process whose state query failed: counted as the tenant's, measured by NVML."""
UNANSWERED = "its memory is counted resident until the driver answers for it"
REDISCOVER_S = 2.0
"""Processes found longer ago than this are looked for again (a context may have appeared)."""


class CudaTenants:
    """Each tenant's processes with CUDA state and what they hold; which tenants are parked,
    refused (unparkable) or quarantined. `CudaBackend` moves them."""

    def __init__(
        self,
        calls: CheckpointDriver,
        nvml: Any,
        proc_root: str,
        cgroup_root: str,
        clock: Callable[[], float],
        call_timeout_s: float,
    ) -> None:
        self.calls = calls
        self.nvml = nvml
        self.proc_root = proc_root
        self.cgroup_root = cgroup_root
        self.call_timeout_s = call_timeout_s
        self._clock = clock
        self._mutex = threading.Lock()
        """Guards the tables below; never held across a driver call."""
        self._refs: dict[str, TenantRef] = {}
        self._found: dict[str, tuple[float, tuple[int, ...]]] = {}
        """Per tenant, when its processes were found and those with CUDA state."""
        self._parked: dict[str, ParkedProcs] = {}
        self._quarantined: dict[str, str] = {}
        self._unparkable: dict[str, str] = {}
        self._unanswered: dict[str, str] = {}
        """Tenants a state query failed for at their last discovery, and why: not parked, and
        counted resident, until the driver answers for every process again."""
        self._problems: dict[str, str] = {}
        self._moving: set[str] = set()
        """Tenants a park or restore is under way for (their processes may be locked)."""
        self._late: dict[str, int] = {}
        """Tenants with undos left to stalled locks' threads that have not run yet (a process
        such a lock locked is that undo's to unlock, not a lookup's)."""

    def _nvml(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """An NVML query with a deadline; an NVML error (unknown UUID, lost GPU) is ours."""
        try:
            return call_with_deadline(self.call_timeout_s, what, fn, self.nvml, *args)
        except nvml_error(self.nvml) as e:
            raise BackendError(f"{what} failed: {e}") from e

    def attach(self, tenant: TenantRef) -> None:
        """Remember how to find the tenant's processes (found on first use, off the event loop)."""
        with self._mutex:
            old = self._refs.get(tenant.tenant_id)
            self._refs[tenant.tenant_id] = tenant
            if old is None or (old.pids, old.pod_uid) != (tenant.pids, tenant.pod_uid):
                self._found.pop(tenant.tenant_id, None)

    def detach(self, tenant_id: str) -> None:
        """Forget the tenant; if its parked processes still live, keep them for its return."""
        with self._mutex:
            parked = self._parked.pop(tenant_id, None)
            if parked and any(Path(self.proc_root, str(p)).exists() for p in parked.pids):
                self._parked[tenant_id] = parked  # still in their memory: restore when back
            for table in (self._refs, self._found, self._quarantined):
                table.pop(tenant_id, None)
            self._unparkable.pop(tenant_id, None)
            self._unanswered.pop(tenant_id, None)
            self._problems.pop(tenant_id, None)

    def rescan(self, tenant_id: str) -> None:
        """Find the tenant's processes again on next use; a refusal may no longer hold."""
        with self._mutex:
            self._found.pop(tenant_id, None)
            self._unparkable.pop(tenant_id, None)

    def tenants(self) -> list[str]:
        """Attached tenants and ones still parked from before a restart."""
        with self._mutex:
            return sorted(set(self._refs) | set(self._parked))

    def _candidates(self, ref: TenantRef) -> set[int]:
        found = {procs.process_of(pid, self.proc_root) for pid in ref.pids}
        if ref.pod_uid:
            found |= set(procs.pod_pids(ref.pod_uid, self.proc_root))
        return found

    def _discover(self, tenant_id: str, settle: bool = False) -> tuple[int, ...]:
        """The tenant's processes with CUDA state, asking the driver about each candidate.

        Processes left locked by a move a restart cut off are settled (see
        `cuda_moves.settle_locked`) unless a move of the tenant is under way: `settle` says the
        caller is that move, before it touched any process. None is while an undo is left to a
        stalled lock (`_late`): the process it locked is that undo's. A process whose state
        query the driver does not support counts as running (its memory stays on the GPU) and
        refuses the tenant (`unparkable`)."""
        with self._mutex:
            ref = self._refs.get(tenant_id)
            settle = (settle or tenant_id not in self._moving) and tenant_id not in self._late
        if ref is None:
            return ()
        states = self._states(tenant_id, sorted(self._candidates(ref)))
        checkpointed = [pid for pid, state in states.items() if state == CHECKPOINTED]
        held: cuda_moves.Sizes = {pid: {g: 0 for g in ref.gpus} for pid in checkpointed}
        for pid, state in states.items():
            if state == FAILED:
                self._quarantine(tenant_id, f"pid {pid} is in the driver's FAILED state")
            elif state == LOCKED and settle:
                sizes = self._bytes(ref.gpus, (pid,))[pid] if checkpointed else {}
                nbytes = sum(sizes.values())
                try:
                    cuda_moves.settle_locked(self.calls, pid, bool(checkpointed), nbytes)
                except BackendError as e:  # left locked: its memory stays counted (NVML lists it)
                    why = f"{e}; {STALLED}" if isinstance(e, CallStalled) else str(e)
                    self._quarantine(tenant_id, f"pid {pid} was found locked: {why}")
                    continue
                if checkpointed:
                    held[pid] = sizes
        if checkpointed:  # parked by an agent that could not save it: the rest of its footprint
            measured = {g: sum(s.get(g, 0) for s in held.values()) for g in ref.gpus}
            declared = ref.declared_bytes or 0
            held[checkpointed[0]] = {g: max(0, declared - measured[g]) for g in ref.gpus}
        with_state = [pid for pid, state in states.items() if state is not None]
        with self._mutex:
            if held and tenant_id not in self._parked:
                self._parked[tenant_id] = ParkedProcs(held)
            self._found[tenant_id] = (self._clock(), tuple(with_state))
        return tuple(with_state)

    def _states(self, tenant_id: str, pids: list[int]) -> dict[int, int | None]:
        """Each process's state, `UNKNOWN` where its query failed: a failed query keeps the
        tenant from being parked until a later discovery's answers (`_unanswered`), one that
        did not return quarantines it. A quarantined tenant's driver may be wedged: it is not
        asked again, and all its processes are `UNKNOWN`."""
        with self._mutex:
            ask = tenant_id not in self._quarantined
        states: dict[int, int | None] = {}
        failed: list[str] = []
        unsupported = ""
        for pid in pids:
            states[pid] = UNKNOWN
            if not ask:
                continue
            try:
                states[pid] = self.calls.state(pid)
            except CallStalled as e:
                self._quarantine(tenant_id, f"{e}; {STALLED}")
                ask = False
            except DriverError as e:
                if e.code != NOT_SUPPORTED:
                    failed.append(str(e))
                    continue
                states[pid] = RUNNING  # its memory stays on the GPU; the tenant is refused
                unsupported = unsupported or f"{e}: {cuda_moves.UNSUPPORTED}"
            except BackendError as e:
                failed.append(str(e))
        with self._mutex:
            if unsupported:
                self._unparkable.setdefault(tenant_id, unsupported)
            if failed:
                self._unanswered[tenant_id] = f"{'; '.join(failed)}; {UNANSWERED}"
            else:
                self._unanswered.pop(tenant_id, None)
        return states

    def pids(self, tenant_id: str) -> tuple[int, ...]:
        """The tenant's GPU processes: parked ones, else those found, found again when none
        were or they were found more than `REDISCOVER_S` ago."""
        with self._mutex:
            parked = self._parked.get(tenant_id)
            found = self._found.get(tenant_id)
        if parked is not None:
            return tuple(sorted(parked.pids))
        if found is not None and found[1] and self._clock() - found[0] < REDISCOVER_S:
            return found[1]
        return self._discover(tenant_id)

    def _bytes(self, gpus: tuple[str, ...], pids: tuple[int, ...]) -> dict[int, dict[str, int]]:
        """Per process, its bytes on each of `gpus` as NVML reports them."""
        out: dict[int, dict[str, int]] = {pid: {} for pid in pids}
        for gpu in gpus:
            used = self._nvml(f"NVML process list of {gpu}", procs.gpu_processes, gpu)
            for pid in pids:
                out[pid][gpu] = used.get(pid, 0)
        return out

    def footprint(self, tenant_id: str, gpu: str) -> int:
        """Bytes its processes use on `gpu` (as NVML reports), or had when parked."""
        with self._mutex:
            parked = self._parked.get(tenant_id)
        if parked is not None:
            return parked.per_gpu().get(gpu, 0)
        return sum(b.get(gpu, 0) for b in self._bytes((gpu,), self.pids(tenant_id)).values())

    def _cgroup(self, tenant_id: str) -> procs.CgroupMemory | None:
        """The cgroup with the least room among its processes: those last found where finding
        them fails (NVML cannot measure a process to settle), which fails this tenant's own
        moves, not the node's read of every tenant; `state()` says why."""
        try:
            pids = self.pids(tenant_id)
        except BackendError as e:
            with self._mutex:
                self._problems[tenant_id] = str(e)
                pids = self._found.get(tenant_id, (0.0, ()))[1]
        root, cgroups = self.proc_root, self.cgroup_root
        found = [procs.memory_cgroup(p, root, cgroups) for p in pids]
        known = [c for c in found if c is not None]
        return min(known, key=lambda c: c.limit - c.used) if known else None

    def memory_limit(self, tenant_id: str) -> int | None:
        """The limit of the memory cgroup with the least room among its processes."""
        found = self._cgroup(tenant_id)
        return None if found is None else found.limit

    def memory_used(self, tenant_id: str) -> int:
        """What that cgroup uses already (the parked bytes would come on top)."""
        found = self._cgroup(tenant_id)
        return 0 if found is None else found.used

    def state(self, tenant_id: str) -> TenantState:
        """Residency, with what the driver said; confirms state adopted after a restart."""
        with self._mutex:
            ref = self._refs.get(tenant_id)
            parked = self._parked.get(tenant_id)
        sizes: dict[str, int] = {}
        try:
            if parked is not None and not parked.confirmed:
                self._confirm(tenant_id, parked)
            with self._mutex:
                parked = self._parked.get(tenant_id)
            sizes = parked.per_gpu() if parked else {}
            if parked is None and ref is not None:
                per_pid = self._bytes(ref.gpus, self.pids(tenant_id))
                for gpu in ref.gpus:
                    sizes[gpu] = sum(b.get(gpu, 0) for b in per_pid.values())
        except CallStalled as e:
            self._quarantine(tenant_id, f"{e}; {STALLED}")
        except BackendError as e:
            with self._mutex:
                self._problems[tenant_id] = str(e)
        gpus = ref.gpus if ref else tuple(sizes)
        with self._mutex:
            st = TenantState(
                tenant_id,
                detail=self._problems.get(tenant_id, ""),
                quarantined=self._quarantined.get(tenant_id, ""),
                unparkable=self._unparkable.get(tenant_id) or self._unanswered.get(tenant_id, ""),
            )
            parked = self._parked.get(tenant_id)
            found = self._found.get(tenant_id, (0.0, ()))[1]
            st.pids = tuple(sorted(parked.pids)) if parked else found
        for gpu in gpus:
            st.residency[gpu] = Residency.PARKED if parked else Residency.RESIDENT
            st.footprint_bytes[gpu] = sizes.get(gpu, 0)
        st.parked_bytes = sum(parked.per_gpu().values()) if parked else 0
        return st

    def _confirm(self, tenant_id: str, parked: ParkedProcs) -> None:
        """Ask the driver about each process recorded as parked before a restart."""
        try:
            still = cuda_moves.confirm(self.calls, parked.pids)
        except BackendQuarantined as e:
            raise self._quarantine(tenant_id, str(e)) from e
        with self._mutex:
            if still:
                self._parked[tenant_id] = ParkedProcs(still)
            else:
                self._parked.pop(tenant_id, None)

    def _quarantine(self, tenant_id: str, why: str) -> BackendQuarantined:
        """Record why the tenant takes no more turns; the error to raise."""
        with self._mutex:
            self._quarantined.setdefault(tenant_id, why)
            return BackendQuarantined(f"{tenant_id} is quarantined: {self._quarantined[tenant_id]}")

    def _stopped(self, tenant_id: str) -> None:
        """Raise if the tenant is quarantined (call with the mutex held)."""
        if tenant_id in self._quarantined:
            raise BackendQuarantined(f"{tenant_id} is quarantined: {self._quarantined[tenant_id]}")
