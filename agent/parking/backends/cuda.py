"""Parks tenants with the CUDA driver's checkpoint API, called in-process through cuda-python.

Park locks every GPU process of the tenant (with a timeout), then checkpoints each one: the driver
copies its device memory into host memory inside that process and releases the GPU. Restore
brings it back and unlocks. A failure on the way is rolled back so the tenant runs on, resident;
what could not be rolled back is reported by `state()`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from agent.parking.backends import procs
from agent.parking.backends.base import (
    Backend,
    BackendError,
    BackendUnavailable,
    Move,
    Residency,
    TenantRef,
    TenantState,
)

INSTALL_HINT = "the cuda backend needs cuda-python and nvidia-ml-py: pip install 'baton-gpu[cuda]'"
MIN_DRIVER_API = 12080
"""cuCheckpointProcess* with a lock timeout: CUDA 12.8 driver API, NVIDIA driver 570 or newer."""
RUNNING, LOCKED, CHECKPOINTED, FAILED = 0, 1, 2, 3


def load_modules() -> tuple[Any, Any]:
    """Import `cuda.bindings.driver` and `pynvml`, or say how to install them."""
    try:
        import pynvml
        from cuda.bindings import driver
    except ImportError as e:
        raise BackendUnavailable(f"{INSTALL_HINT} ({e})") from e
    return driver, pynvml


class CudaBackend(Backend):
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
    ) -> None:
        if driver is None or nvml is None:
            driver, nvml = load_modules()
        self.driver = driver
        self.nvml = nvml
        self.lock_timeout_ms = lock_timeout_ms
        self.proc_root = proc_root
        self.cgroup_root = cgroup_root
        self._clock = clock
        self._refs: dict[str, TenantRef] = {}
        self._parked: dict[str, dict[str, int]] = {}
        """Tenant to the per GPU bytes it had when parked."""
        self._parked_pids: dict[str, tuple[int, ...]] = {}
        self._problems: dict[str, str] = {}
        self._mutex = threading.Lock()
        self.driver_version = self._check_driver()

    def _check_driver(self) -> int:
        """The driver API version; raises `BackendUnavailable` saying what is needed."""
        if not hasattr(self.driver, "cuCheckpointProcessLock"):
            raise BackendUnavailable(f"cuda-python is too old for checkpointing; {INSTALL_HINT}")
        try:
            err, version = self.driver.cuDriverGetVersion()
            self._check(err, "cuDriverGetVersion")
            if version < MIN_DRIVER_API:
                raise BackendUnavailable(
                    f"the cuda backend needs NVIDIA driver 570 or newer (CUDA 12.8 driver API); "
                    f"this driver supports CUDA {version // 1000}.{version % 1000 // 10}"
                )
            (err,) = self.driver.cuInit(0)
            self._check(err, "cuInit")
            self.nvml.nvmlInit()
        except (RuntimeError, OSError, BackendError) as e:
            if isinstance(e, BackendUnavailable):
                raise
            raise BackendUnavailable(f"no usable NVIDIA driver here: {e}") from e
        return int(version)

    def _check(self, err: Any, call: str, pid: int | None = None) -> None:
        """Raise `BackendError` naming the call, the process and the CUDA error."""
        if err == self.driver.CUresult.CUDA_SUCCESS:
            return
        _, name = self.driver.cuGetErrorName(err)
        label = name.decode() if isinstance(name, bytes) else str(name or err)
        where = f" on pid {pid}" if pid is not None else ""
        raise BackendError(f"{call}{where} failed: {label}")

    def gpu_memory(self) -> dict[str, int]:
        """Every GPU's UUID and total memory."""
        return procs.gpu_memory(self.nvml)

    def attach(self, tenant: TenantRef) -> None:
        """Remember how to find the tenant's processes; notice ones still parked from before."""
        self._refs[tenant.tenant_id] = tenant
        if tenant.tenant_id in self._parked or not tenant.pids:
            return
        held = [p for p in tenant.pids if self._state_of(p) in (LOCKED, CHECKPOINTED)]
        if held:
            size = tenant.declared_bytes or 0
            self._parked[tenant.tenant_id] = {g: size for g in tenant.gpus}
            self._parked_pids[tenant.tenant_id] = tenant.pids

    def detach(self, tenant_id: str) -> None:
        """Forget the tenant (its processes are gone, and with them their parked memory)."""
        self._refs.pop(tenant_id, None)
        self._parked.pop(tenant_id, None)
        self._parked_pids.pop(tenant_id, None)
        self._problems.pop(tenant_id, None)

    def tenants(self) -> list[str]:
        """Attached tenants."""
        return list(self._refs)

    def pids(self, tenant_id: str) -> tuple[int, ...]:
        """The tenant's GPU processes: registered PIDs, else NVML's matched to its pod by cgroup."""
        if tenant_id in self._parked_pids:
            return self._parked_pids[tenant_id]
        ref = self._refs.get(tenant_id)
        if ref is None:
            return ()
        if ref.pids:
            return ref.pids
        found = set()
        for gpu in ref.gpus:
            found |= {p for p in procs.gpu_processes(self.nvml, gpu) if procs.in_pod(
                p, ref.pod_uid, self.proc_root)}  # fmt: skip
        return tuple(sorted(found))

    def footprint(self, tenant_id: str, gpu: str) -> int:
        """Bytes its processes use on `gpu` (as NVML reports), or had when parked."""
        if tenant_id in self._parked:
            return self._parked[tenant_id].get(gpu, 0)
        return self._bytes_on(gpu, self.pids(tenant_id))

    def _bytes_on(self, gpu: str, pids: Collection[int]) -> int:
        """Bytes NVML reports on `gpu` for the processes `pids`."""
        return sum(n for p, n in procs.gpu_processes(self.nvml, gpu).items() if p in pids)

    def memory_limit(self, tenant_id: str) -> int | None:
        """The tightest memory cgroup limit among its processes."""
        limits = [
            procs.memory_limit(p, self.proc_root, self.cgroup_root) for p in self.pids(tenant_id)
        ]
        known = [n for n in limits if n is not None]
        return min(known) if known else None

    def state(self, tenant_id: str) -> TenantState:
        """Residency from the driver's process states."""
        ref = self._refs.get(tenant_id)
        gpus = ref.gpus if ref else ()
        st = TenantState(tenant_id, detail=self._problems.get(tenant_id, ""))
        parked = self._parked.get(tenant_id)
        pids = set(self.pids(tenant_id)) if gpus and parked is None else set()
        for gpu in gpus:
            if parked is None:
                st.residency[gpu] = Residency.RESIDENT
                st.footprint_bytes[gpu] = self._bytes_on(gpu, pids)
            else:
                st.residency[gpu] = Residency.PARKED
                st.footprint_bytes[gpu] = parked.get(gpu, 0)
        if parked is not None:
            st.parked_bytes = sum(parked.values())
        return st

    def _state_of(self, pid: int) -> int:
        err, state = self.driver.cuCheckpointProcessGetState(pid)
        self._check(err, "cuCheckpointProcessGetState", pid)
        return int(state)

    def park(self, tenant_id: str, gpu: str) -> Move:
        """Lock then checkpoint every process of the tenant; roll back on failure."""
        with self._mutex:
            if tenant_id in self._parked:
                return Move(tenant_id, gpu, "park", 0, 0.0)
            ref = self._refs.get(tenant_id)
            pids = self.pids(tenant_id)
            if ref is None or not pids:
                raise BackendError(f"{tenant_id} has no GPU processes to park")
            held = set(pids)
            sizes = {g: self._bytes_on(g, held) for g in ref.gpus}
            start = self._clock()
            self._lock_all(tenant_id, pids)
            done: list[int] = []
            try:
                for pid in pids:
                    (err,) = self.driver.cuCheckpointProcessCheckpoint(pid, None)
                    self._check(err, "cuCheckpointProcessCheckpoint", pid)
                    done.append(pid)
            except BackendError as e:
                self._roll_back(tenant_id, pids, done, e)
                raise
            self._parked[tenant_id] = sizes
            self._parked_pids[tenant_id] = pids
            self._problems.pop(tenant_id, None)
            return Move(tenant_id, gpu, "park", sum(sizes.values()), self._clock() - start)

    def _lock_all(self, tenant_id: str, pids: tuple[int, ...]) -> None:
        args = self.driver.CUcheckpointLockArgs()
        args.timeoutMs = self.lock_timeout_ms
        locked: list[int] = []
        try:
            for pid in pids:
                (err,) = self.driver.cuCheckpointProcessLock(pid, args)
                self._check(err, f"cuCheckpointProcessLock ({self.lock_timeout_ms} ms)", pid)
                locked.append(pid)
        except BackendError as e:
            self._roll_back(tenant_id, pids, [], e, locked)
            raise

    def _roll_back(
        self,
        tenant_id: str,
        pids: tuple[int, ...],
        checkpointed: list[int],
        cause: BackendError,
        locked: list[int] | None = None,
    ) -> None:
        """Return every touched process to running; record any that would not go back."""
        stuck = []
        for pid in pids if locked is None else locked:
            try:
                self._resume(pid, checkpointed=pid in checkpointed)
            except BackendError as e:
                stuck.append(f"{pid}: {e}")
        if stuck:
            self._problems[tenant_id] = (
                f"park failed ({cause}) and processes could not be returned to running: "
                + "; ".join(stuck)
            )

    def _resume(self, pid: int, checkpointed: bool) -> None:
        """Bring one process's memory back (if `checkpointed`) and unlock it, so it runs again."""
        if checkpointed:
            (err,) = self.driver.cuCheckpointProcessRestore(pid, None)
            self._check(err, "cuCheckpointProcessRestore", pid)
        if self._state_of(pid) == LOCKED:
            (err,) = self.driver.cuCheckpointProcessUnlock(pid, None)
            self._check(err, "cuCheckpointProcessUnlock", pid)

    def restore(self, tenant_id: str, gpu: str) -> Move:
        """Restore then unlock every process of the tenant."""
        with self._mutex:
            sizes = self._parked.get(tenant_id)
            if sizes is None:
                return Move(tenant_id, gpu, "restore", 0, 0.0)
            start = self._clock()
            failed = []
            for pid in self._parked_pids[tenant_id]:
                try:
                    self._resume(pid, checkpointed=self._state_of(pid) == CHECKPOINTED)
                except BackendError as e:
                    failed.append(str(e))
            if failed:
                self._problems[tenant_id] = "restore incomplete: " + "; ".join(failed)
                raise BackendError(f"{tenant_id}: " + "; ".join(failed))
            del self._parked[tenant_id], self._parked_pids[tenant_id]
            self._problems.pop(tenant_id, None)
            return Move(tenant_id, gpu, "restore", sum(sizes.values()), self._clock() - start)

    def close(self) -> None:
        """Leave parked processes parked (their memory is inside them); release NVML."""
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()
