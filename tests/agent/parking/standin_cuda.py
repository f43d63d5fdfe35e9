"""Stand-ins for `cuda.bindings.driver` and `pynvml` that follow the checkpoint state machine.

Calls return tuples led by a `CUresult`, as cuda-python's do; a call in the wrong state answers
CUDA_ERROR_ILLEGAL_STATE. A checkpointed process vanishes from NVML's process list.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import SimpleNamespace


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_ILLEGAL_STATE = 401
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_NOT_SUPPORTED = 801


RUNNING, LOCKED, CHECKPOINTED, FAILED = 0, 1, 2, 3


class CUcheckpointLockArgs:
    timeoutMs = 0


@dataclass
class StandInDriver:
    """The checkpoint calls of one node's driver; `fail` maps (call, pid) to an error."""

    version: int = 12080
    states: dict[int, int] = field(default_factory=dict)
    fail: dict[tuple[str, int], CUresult] = field(default_factory=dict)
    calls: list[tuple[str, int]] = field(default_factory=list)
    lock_timeouts: list[int] = field(default_factory=list)
    CUresult = CUresult
    CUcheckpointLockArgs = CUcheckpointLockArgs

    def cuDriverGetVersion(self):
        return (CUresult.CUDA_SUCCESS, self.version)

    def cuInit(self, flags):
        return (CUresult.CUDA_SUCCESS,)

    def cuGetErrorName(self, err):
        return (CUresult.CUDA_SUCCESS, CUresult(err).name.encode())

    def cuCheckpointProcessGetState(self, pid):
        if pid not in self.states:
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None)
        return (CUresult.CUDA_SUCCESS, self.states[pid])

    def _step(self, call, pid, need, to):
        self.calls.append((call, pid))
        if (call, pid) in self.fail:
            return (self.fail.pop((call, pid)),)
        if self.states.get(pid) != need:
            return (CUresult.CUDA_ERROR_ILLEGAL_STATE,)
        self.states[pid] = to
        return (CUresult.CUDA_SUCCESS,)

    def cuCheckpointProcessLock(self, pid, args):
        self.lock_timeouts.append(args.timeoutMs)
        return self._step("lock", pid, RUNNING, LOCKED)

    def cuCheckpointProcessCheckpoint(self, pid, args):
        return self._step("checkpoint", pid, LOCKED, CHECKPOINTED)

    def cuCheckpointProcessRestore(self, pid, args):
        return self._step("restore", pid, CHECKPOINTED, LOCKED)

    def cuCheckpointProcessUnlock(self, pid, args):
        return self._step("unlock", pid, LOCKED, RUNNING)


class StandInNvml:
    """Per GPU processes and their memory; checkpointed processes are not listed."""

    def __init__(self, driver: StandInDriver, gpus: dict[str, int]) -> None:
        self.driver = driver
        self.gpus = gpus
        self.used: dict[str, dict[int, int]] = {g: {} for g in gpus}

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return list(self.gpus)[i]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return uuid

    def nvmlDeviceGetUUID(self, handle):
        return handle

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=self.gpus[handle])

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=n)
            for pid, n in self.used[handle].items()
            if self.driver.states.get(pid) != CHECKPOINTED
        ]
