"""Parks tenants with the CUDA driver's checkpoint API, called in-process through cuda-python.

A tenant's processes are its registered PIDs plus, for a pod, every process in the pod's cgroup;
those with CUDA state count. They are found again before each park, when a session opens, and
whenever what was found is older than `REDISCOVER_S` or empty: a PyTorch tenant opens its session
before it makes its CUDA context, so at session open it has none. Park locks
them all (with a timeout), then checkpoints each: the driver copies its device memory into host
memory inside that process and releases the GPU. Restore first checks that the GPU has the bytes
free plus `headroom_bytes`, restores every process, then unlocks them. All of a tenant's
processes move or none do: a failure undoes the ones done.

Every driver call has a deadline and runs outside the backend's lock. A tenant whose processes
end up anywhere but RUNNING after a resume (FAILED included), whose restore ran out of device
memory, or one of whose calls did not return in time is quarantined: it takes no more turns and
`state()` says why. A tenant the driver cannot checkpoint (NCCL, CUDA IPC, managed memory) is
refused: it stays resident, and `state()` says why. Which processes are a tenant's and which
tenants are parked, refused or quarantined is kept by `agent.parking.backends.cuda_tenants`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from agent.parking.backends import cuda_moves, procs
from agent.parking.backends.base import (
    Backend,
    BackendError,
    BackendQuarantined,
    BackendUnavailable,
    Move,
    Unparkable,
)
from agent.parking.backends.cuda_driver import (
    CheckpointDriver,
    bindings_version,
    check_bindings,
    check_driver,
    load_modules,
    nvml_error,
)
from agent.parking.backends.cuda_moves import SHARING, ParkedProcs
from agent.parking.backends.cuda_tenants import REDISCOVER_S, STALLED, CudaTenants
from agent.parking.backends.deadline import CallStalled

__all__ = ["DEFAULT_HEADROOM", "REDISCOVER_S", "CudaBackend"]

DEFAULT_HEADROOM = 1 << 30
"""Bytes a restore needs free beyond what it brings back (CUDA contexts, allocator slack)."""
NCCL_SHM = "/dev/shm/nccl-"
"""NCCL's shared-memory segments: a process mapping one shares GPU memory with its peers."""


class CudaBackend(CudaTenants, Backend):
    """Checkpoints and restores each tenant's GPU processes."""

    name = "cuda"

    def __init__(
        self,
        driver: Any = None,
        nvml: Any = None,
        lock_timeout_ms: int = 5000,
        proc_root: str = "/proc",
        cgroup_root: str = "/sys/fs/cgroup",
        clock: Callable[[], float] = time.monotonic,
        call_timeout_s: float = 10.0,
        copy_gbps: float = 1.0,
        headroom_bytes: int = DEFAULT_HEADROOM,
        bindings: str | None = None,
    ) -> None:
        if driver is None or nvml is None:
            driver, nvml = load_modules()
            bindings = bindings_version() if bindings is None else bindings
        self.bindings = bindings or ""
        check_bindings(driver, self.bindings)
        calls = CheckpointDriver(driver, lock_timeout_ms, call_timeout_s, copy_gbps * 1e9)
        super().__init__(calls, nvml, proc_root, cgroup_root, clock, call_timeout_s)
        self.driver = driver
        self.headroom_bytes = headroom_bytes
        self.driver_version = check_driver(driver, nvml, self.calls.error_name)

    def gpu_memory(self) -> dict[str, int]:
        """Every GPU's UUID and total memory."""
        try:
            return procs.gpu_memory(self.nvml)
        except nvml_error(self.nvml) as e:
            raise BackendUnavailable(f"NVML cannot list the GPUs: {e}") from e

    # Moves.

    def park(self, tenant_id: str, gpu: str) -> Move:
        """Lock then checkpoint every process of the tenant; undo all on failure."""
        return self._while_moving(tenant_id, self._park, gpu)

    def restore(self, tenant_id: str, gpu: str) -> Move:
        """Check there is room, restore every process, then unlock them all; undo on failure."""
        return self._while_moving(tenant_id, self._restore, gpu)

    def _while_moving(self, tenant_id: str, move: Callable[[str, str], Move], gpu: str) -> Move:
        with self._mutex:
            self._moving.add(tenant_id)
        try:
            return move(tenant_id, gpu)
        finally:
            with self._mutex:
                self._moving.discard(tenant_id)

    def _late_undo(self, tenant_id: str) -> cuda_moves.Late:
        """The tenant counts as moving from when an undo is left to a stalled lock's thread
        until it ran: a lookup meanwhile must not settle the process that lock locks."""

        def left() -> Callable[[], None]:
            with self._mutex:
                self._late[tenant_id] = self._late.get(tenant_id, 0) + 1

            def ran() -> None:
                with self._mutex:
                    self._late[tenant_id] -= 1
                    if not self._late[tenant_id]:
                        del self._late[tenant_id]

            return ran

        return left

    def _park(self, tenant_id: str, gpu: str) -> Move:
        with self._mutex:
            if tenant_id in self._parked:
                return Move(tenant_id, gpu, "park", 0, 0.0)
            self._stopped(tenant_id)
            if tenant_id in self._unparkable:
                raise Unparkable(f"{tenant_id}: {self._unparkable[tenant_id]}")
            ref = self._refs.get(tenant_id)
        if ref is None:
            raise BackendError(f"{tenant_id} is not known to the cuda backend")
        try:
            pids = self._discover(tenant_id, settle=True)
            with self._mutex:
                self._stopped(tenant_id)
                if tenant_id in self._parked:  # found checkpointed by the driver already
                    return Move(tenant_id, gpu, "park", 0, 0.0)
                if tenant_id in self._unparkable:  # the driver cannot checkpoint a process
                    raise Unparkable(self._unparkable[tenant_id])
                unanswered = self._unanswered.get(tenant_id)
            if unanswered:  # retryable: the driver is asked again at the next try
                raise BackendError(f"{tenant_id} is not parked: {unanswered}")
            if not pids:
                raise BackendError(f"{tenant_id} has no processes with CUDA state to park")
            for pid in pids:
                if procs.maps_path(pid, NCCL_SHM, self.proc_root):
                    raise Unparkable(f"pid {pid} maps NCCL shared memory ({NCCL_SHM}*); {SHARING}")
            sizes = self._bytes(ref.gpus, pids)
            start = self._clock()
            moved_pids = cuda_moves.park_all(self.calls, pids, sizes, self._late_undo(tenant_id))
        except CallStalled as e:
            raise self._quarantine(tenant_id, f"{e}; {STALLED}") from e
        except BackendQuarantined as e:
            raise self._quarantine(tenant_id, str(e)) from e
        except Unparkable as e:
            with self._mutex:
                self._unparkable[tenant_id] = str(e)
            raise Unparkable(f"{tenant_id}: {e}") from e
        sizes = {pid: sizes[pid] for pid in moved_pids}
        with self._mutex:
            self._parked[tenant_id] = ParkedProcs(sizes)
            self._problems.pop(tenant_id, None)
        moved = sum(sum(s.values()) for s in sizes.values())
        return Move(tenant_id, gpu, "park", moved, self._clock() - start)

    def _restore(self, tenant_id: str, gpu: str) -> Move:
        with self._mutex:
            parked = self._parked.get(tenant_id)
            if parked is None:
                return Move(tenant_id, gpu, "restore", 0, 0.0)
            self._stopped(tenant_id)
        try:
            if not parked.confirmed:
                self._confirm(tenant_id, parked)
                with self._mutex:
                    parked = self._parked.get(tenant_id)
                if parked is None:
                    return Move(tenant_id, gpu, "restore", 0, 0.0)
            self._check_room(tenant_id, parked)
            start = self._clock()
            back = cuda_moves.restore_all(self.calls, parked.pids)
        except CallStalled as e:
            raise self._quarantine(tenant_id, f"{e}; {STALLED}") from e
        except BackendQuarantined as e:
            raise self._quarantine(tenant_id, str(e)) from e
        with self._mutex:
            self._parked.pop(tenant_id, None)
            self._found[tenant_id] = (self._clock(), back)
            self._problems.pop(tenant_id, None)
        moved = sum(sum(parked.pids[pid].values()) for pid in back)
        return Move(tenant_id, gpu, "restore", moved, self._clock() - start)

    def _check_room(self, tenant_id: str, parked: ParkedProcs) -> None:
        """Refuse (retryably) a restore without room: a failed one would poison the process."""
        for gpu, n in sorted(parked.per_gpu().items()):
            free = self._nvml(f"NVML memory info of {gpu}", procs.gpu_free, gpu)
            cuda_moves.check_room(tenant_id, gpu, n, self.headroom_bytes, free)

    # Restarts.

    def durable(self) -> dict[str, Any]:
        """Parked processes and their bytes per tenant, and why tenants are quarantined."""
        with self._mutex:
            return cuda_moves.durable(self._parked, self._quarantined)

    def adopt(self, saved: dict[str, Any]) -> None:
        """Take back parked processes (unconfirmed until the driver is asked) and quarantines."""
        parked, quarantined = cuda_moves.adopted(saved)
        with self._mutex:
            self._parked.update(parked)
            self._quarantined.update(quarantined)

    def close(self) -> None:
        """Leave parked processes parked (their memory is inside them); release NVML."""
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()
