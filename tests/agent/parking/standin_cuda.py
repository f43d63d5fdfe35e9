"""Stand-ins for `cuda.bindings.driver` and `pynvml` that model the driver's checkpoint behaviour.

Calls return tuples led by a `CUresult`, as cuda-python's do. Per process states follow the
documented machine (RUNNING → LOCKED → CHECKPOINTED → LOCKED → RUNNING; a call in the wrong
state answers CUDA_ERROR_ILLEGAL_STATE). Modelled from the driver's documentation and the
public NVIDIA/cuda-checkpoint bug reports:

* a process without a CUDA context answers the state query with NOT_INITIALIZED, a PID the
  driver does not know with INVALID_VALUE; one gains its context later (`make_context`), as a
  PyTorch tenant does on its first CUDA call, after it opened its session;
* a process that only called cuInit (`cuinit_only`) is RUNNING to the state query and listed by
  NVML with 0 bytes, but its lock answers NOT_INITIALIZED;
* a process caught mid-move by another caller answers CHECKPOINTING (4) or RESTORING (5) to
  the state query (`passing`) before its settled state; bindings older than 13.4 cannot name
  those states and raise ValueError ("4 is not a valid CUprocessState") as cuda-bindings 13.0.3
  does (`known_states` 4), and they raise KeyError for a result code they do not know
  (`unknown_code`);
* a process the driver cannot checkpoint at all (`unsupported`: some container runtimes, MIG)
  answers every checkpoint call, the state query included, with NOT_SUPPORTED;
* an injected failure (`fail`) can leave the process FAILED (`leaves`);
* a restore that does not fit the GPU's free memory answers OUT_OF_MEMORY; every later restore
  of that process answers OPERATING_SYSTEM (304) and its unlock ILLEGAL_STATE (401), as driver
  580.95 does (NVIDIA/cuda-checkpoint#44);
* processes that share GPU memory (`shared`, e.g. NCCL ranks): a state query or lock of one
  blocks while a peer is locked, until `hang_over` is set (then it answers NOT_READY); with
  `lands_late` given, such a lock is carried out once that is set, after the peer was unlocked
  (NVIDIA/cuda-checkpoint#30: a hung call is carried out once the peer unlocks);
* a thread's ID stands for its process (`threads`): the driver finds the process through
  /proc, where a thread's ID resolves too (NVIDIA/cuda-checkpoint#41);
* a process may exit just before a call reaches it (`exit_before`): then the driver knows it no
  more (INVALID_VALUE) and NVML no longer lists it;
* a checkpointed process vanishes from NVML's process list and frees its device memory;
* NVML raises `NVMLError` for a UUID it does not know, for every query once `lost` is set, and
  for every query of a GPU in `lost_gpus`.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NOT_INITIALIZED = 3
    CUDA_ERROR_OPERATING_SYSTEM = 304
    CUDA_ERROR_INVALID_CONTEXT = 201
    CUDA_ERROR_ILLEGAL_STATE = 401
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_NOT_SUPPORTED = 801
    CUDA_ERROR_UNKNOWN = 999


RUNNING, LOCKED, CHECKPOINTED, FAILED, CHECKPOINTING, RESTORING = 0, 1, 2, 3, 4, 5
HANG_BOUND_S = 30.0
"""A blocked stand-in call gives up after this long even if `hang_over` is never set."""


class CUcheckpointLockArgs:
    timeoutMs = 0


@dataclass
class StandInDriver:
    """The checkpoint calls of one node's driver; `fail` maps (call, pid) to an error."""

    version: int = 12080
    states: dict[int, int] = field(default_factory=dict)
    no_context: set[int] = field(default_factory=set)
    cuinit_only: set[int] = field(default_factory=set)
    passing: dict[int, list[int]] = field(default_factory=dict)
    """Per process, transient states (4, 5) the state query answers before its settled one."""
    fail: dict[tuple[str, int], CUresult] = field(default_factory=dict)
    leaves: dict[tuple[str, int], int] = field(default_factory=dict)
    """The state an injected failure leaves the process in (default: unchanged)."""
    shared: list[set[int]] = field(default_factory=list)
    poisoned: set[int] = field(default_factory=set)
    hang: set[tuple[str, int]] = field(default_factory=set)
    """Calls (a state query too) that do not return until `hang_over` is set (then answer
    NOT_READY)."""
    state_fails: dict[int, CUresult] = field(default_factory=dict)
    """Processes whose state query answers this error, for as long as they are listed."""
    refuses: dict[tuple[str, int], CUresult] = field(default_factory=dict)
    """Calls (lock, checkpoint, restore, unlock) that answer this error every time they are
    made, leaving the process as it was, for as long as they are listed."""
    known_states: int = 6
    """States the bindings can name; a larger one raises ValueError, as their enum does."""
    unknown_code: dict[tuple[str, int], int] = field(default_factory=dict)
    """Calls whose answer is a result code the bindings do not know (they raise KeyError)."""
    threads: dict[int, int] = field(default_factory=dict)
    """Thread IDs and the process each belongs to: a call on one acts on its process."""
    exit_before: set[tuple[str, int]] = field(default_factory=set)
    """Calls just before which their process exits."""
    unsupported: set[int] = field(default_factory=set)
    """Processes every checkpoint call on which answers NOT_SUPPORTED."""
    calls: list[tuple[str, int]] = field(default_factory=list)
    lock_timeouts: list[int] = field(default_factory=list)
    hang_over: threading.Event = field(default_factory=threading.Event)
    blocked: threading.Event = field(default_factory=threading.Event)
    """Set once a call has blocked on a locked peer."""
    lands_late: threading.Event | None = None
    """Set: a lock blocked on a locked peer is carried out (None: it answers NOT_READY)."""
    nvml: Any = None
    CUresult = CUresult
    CUcheckpointLockArgs = CUcheckpointLockArgs

    def __post_init__(self) -> None:
        self._mutex = threading.Lock()

    def cuDriverGetVersion(self):
        return (CUresult.CUDA_SUCCESS, self.version)

    def cuInit(self, flags):
        return (CUresult.CUDA_SUCCESS,)

    def cuGetErrorName(self, err):
        return (CUresult.CUDA_SUCCESS, CUresult(err).name.encode())

    def _peer_locked(self, pid: int) -> bool:
        with self._mutex:
            return any(
                pid in group and any(self.states.get(p) == LOCKED for p in group - {pid})
                for group in self.shared
            )

    def _hang_if_peer_locked(self, pid: int) -> bool:
        """Block while a peer sharing memory with `pid` is locked; True if it blocked."""
        if not self._peer_locked(pid):
            return False
        self.blocked.set()
        self.hang_over.wait(HANG_BOUND_S)
        return True

    def make_context(self, pid: int, gpu: str, nbytes: int) -> None:
        """The process makes its CUDA context and allocates `nbytes` on `gpu`."""
        self.no_context.discard(pid)
        self.states[pid] = RUNNING
        if self.nvml is not None:
            self.nvml.used[gpu][pid] = nbytes

    def exit(self, pid: int) -> None:
        """The process ends: its CUDA state and its device memory go with it."""
        self.states.pop(pid, None)
        if self.nvml is not None:
            for used in self.nvml.used.values():
                used.pop(pid, None)

    def cuCheckpointProcessGetState(self, pid):
        self.calls.append(("state", pid))
        pid = self.threads.get(pid, pid)
        if ("state", pid) in self.exit_before:
            self.exit_before.discard(("state", pid))
            self.exit(pid)
        if ("state", pid) in self.unknown_code:
            raise KeyError(self.unknown_code[("state", pid)])
        if self._hang_if_peer_locked(pid):
            return (CUresult.CUDA_ERROR_NOT_READY, None)
        if pid in self.unsupported:
            return (CUresult.CUDA_ERROR_NOT_SUPPORTED, None)
        if ("state", pid) in self.hang:
            self.blocked.set()
            self.hang_over.wait(HANG_BOUND_S)
            return (CUresult.CUDA_ERROR_NOT_READY, None)
        if pid in self.state_fails:
            return (self.state_fails[pid], None)
        if self.passing.get(pid):
            state = self.passing[pid].pop(0)
            if state >= self.known_states:
                raise ValueError(f"{state} is not a valid CUprocessState")
            return (CUresult.CUDA_SUCCESS, state)
        if pid in self.no_context:
            return (CUresult.CUDA_ERROR_NOT_INITIALIZED, None)
        if pid in self.cuinit_only:
            return (CUresult.CUDA_SUCCESS, RUNNING)
        if pid not in self.states:
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None)
        return (CUresult.CUDA_SUCCESS, self.states[pid])

    def _step(self, call, pid, need, to):
        self.calls.append((call, pid))
        pid = self.threads.get(pid, pid)
        if (call, pid) in self.exit_before:
            self.exit_before.discard((call, pid))
            self.exit(pid)
        if (call, pid) in self.unknown_code:
            raise KeyError(self.unknown_code[(call, pid)])
        if (call, pid) in self.hang:
            self.blocked.set()
            self.hang_over.wait(HANG_BOUND_S)
            return (CUresult.CUDA_ERROR_NOT_READY,)
        if pid in self.unsupported:
            return (CUresult.CUDA_ERROR_NOT_SUPPORTED,)
        if (call, pid) in self.refuses:
            return (self.refuses[(call, pid)],)
        if (call, pid) in self.fail:
            err = self.fail.pop((call, pid))
            if (call, pid) in self.leaves:
                self.states[pid] = self.leaves.pop((call, pid))
            if call == "restore" and err == CUresult.CUDA_ERROR_OUT_OF_MEMORY:
                self.poisoned.add(pid)
            return (err,)
        if pid in self.cuinit_only:
            return (CUresult.CUDA_ERROR_NOT_INITIALIZED,)
        if pid in self.no_context or pid not in self.states:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        if self.states.get(pid) != need:
            return (CUresult.CUDA_ERROR_ILLEGAL_STATE,)
        self.states[pid] = to
        return (CUresult.CUDA_SUCCESS,)

    def cuCheckpointProcessLock(self, pid, args):
        self.lock_timeouts.append(args.timeoutMs)
        if self.lands_late is not None and self._peer_locked(pid):
            self.blocked.set()
            self.lands_late.wait(HANG_BOUND_S)
            return self._step("lock", pid, RUNNING, LOCKED)
        if self._hang_if_peer_locked(pid):
            self.calls.append(("lock", pid))
            return (CUresult.CUDA_ERROR_NOT_READY,)
        return self._step("lock", pid, RUNNING, LOCKED)

    def cuCheckpointProcessCheckpoint(self, pid, args):
        return self._step("checkpoint", pid, LOCKED, CHECKPOINTED)

    def cuCheckpointProcessRestore(self, pid, args):
        if self.states.get(pid) == CHECKPOINTED and pid in self.poisoned:
            self.calls.append(("restore", pid))
            return (CUresult.CUDA_ERROR_OPERATING_SYSTEM,)
        if self.states.get(pid) == CHECKPOINTED and not self._fits(pid):
            self.calls.append(("restore", pid))
            self.poisoned.add(pid)
            return (CUresult.CUDA_ERROR_OUT_OF_MEMORY,)
        return self._step("restore", pid, CHECKPOINTED, LOCKED)

    def cuCheckpointProcessUnlock(self, pid, args):
        return self._step("unlock", pid, LOCKED, RUNNING)

    def _fits(self, pid: int) -> bool:
        if self.nvml is None:
            return True
        return all(used.get(pid, 0) <= self.nvml.free(gpu) for gpu, used in self.nvml.used.items())


class NVMLError(Exception):
    """What pynvml raises for a failed query."""


class StandInNvml:
    """Per GPU processes and their memory; checkpointed processes are neither listed nor count."""

    NVMLError = NVMLError

    def __init__(
        self, driver: StandInDriver, gpus: dict[str, int], release: str = "580.95.05"
    ) -> None:
        self.driver = driver
        self.release = release
        self.lost = False
        """Set: the GPU fell off the bus; every device query raises."""
        self.lost_gpus: set[str] = set()
        """GPUs that fell off the bus alone: every query of one of them raises."""
        driver.nvml = self
        self.gpus = gpus
        self.used: dict[str, dict[int, int]] = {g: {} for g in gpus}
        self.other: dict[str, int] = {g: 0 for g in gpus}
        """Bytes used on each GPU by processes outside every tenant."""

    def free(self, gpu: str) -> int:
        listed = sum(n for pid, n in self.used[gpu].items() if self._listed(pid))
        return self.gpus[gpu] - listed - self.other[gpu]

    def _listed(self, pid: int) -> bool:
        return self.driver.states.get(pid) != CHECKPOINTED

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return self.release

    def _device(self, handle):
        if self.lost or handle in self.lost_gpus or handle not in self.gpus:
            raise NVMLError("Not Found" if handle not in self.gpus else "GPU is lost")
        return handle

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return list(self.gpus)[i]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return self._device(uuid)

    def nvmlDeviceGetUUID(self, handle):
        return handle

    def nvmlDeviceGetMemoryInfo(self, handle):
        free = self.free(self._device(handle))
        return SimpleNamespace(total=self.gpus[handle], free=free, used=self.gpus[handle] - free)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=n)
            for pid, n in self.used[self._device(handle)].items()
            if self._listed(pid)
        ]
