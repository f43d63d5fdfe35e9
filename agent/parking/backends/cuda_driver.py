"""The driver's checkpoint calls for one process each, with deadlines and named errors.

Each call runs through `deadline.call_with_deadline`: lock gets its own timeout plus the call
timeout; checkpoint and restore get the call timeout plus the time to copy their bytes at the
slowest copy rate assumed. A state query that answers "not initialized" or "invalid value" means
the process has no CUDA state (no context yet, or it is gone), not an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.parking.backends.base import BackendError, BackendUnavailable
from agent.parking.backends.deadline import call_with_deadline

INSTALL_HINT = "the cuda backend needs cuda-python and nvidia-ml-py: pip install 'baton-gpu[cuda]'"
MIN_DRIVER_API = 12080
"""cuCheckpointProcess* with a lock timeout: CUDA 12.8 driver API, NVIDIA driver 570 or newer."""
RUNNING, LOCKED, CHECKPOINTED, FAILED = 0, 1, 2, 3
STATE_NAMES = {RUNNING: "running", LOCKED: "locked", CHECKPOINTED: "checkpointed", FAILED: "failed"}
NO_CUDA_STATE = ("CUDA_ERROR_NOT_INITIALIZED", "CUDA_ERROR_INVALID_VALUE")
OUT_OF_MEMORY = "CUDA_ERROR_OUT_OF_MEMORY"
NOT_SUPPORTED = "CUDA_ERROR_NOT_SUPPORTED"


def state_name(state: int | None) -> str:
    """A process state as a word ("gone" for a process without CUDA state)."""
    return "gone" if state is None else STATE_NAMES.get(state, f"state {state}")


def load_modules() -> tuple[Any, Any]:
    """Import `cuda.bindings.driver` and `pynvml`, or say how to install them."""
    try:
        import pynvml
        from cuda.bindings import driver
    except ImportError as e:
        raise BackendUnavailable(f"{INSTALL_HINT} ({e})") from e
    return driver, pynvml


def check_driver(driver: Any, nvml: Any, error_name: Callable[[Any], str]) -> int:
    """The driver API version; raises `BackendUnavailable` saying what is needed."""
    if not hasattr(driver, "cuCheckpointProcessLock"):
        raise BackendUnavailable(f"cuda-python is too old for checkpointing; {INSTALL_HINT}")
    try:
        err, version = driver.cuDriverGetVersion()
        if err != driver.CUresult.CUDA_SUCCESS:
            raise BackendError(f"cuDriverGetVersion failed: {error_name(err)}")
        if version < MIN_DRIVER_API:
            raise BackendUnavailable(
                f"the cuda backend needs NVIDIA driver 570 or newer (CUDA 12.8 driver API); "
                f"this driver supports CUDA {version // 1000}.{version % 1000 // 10}"
            )
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise BackendError(f"cuInit failed: {error_name(err)}")
        nvml.nvmlInit()
    except (RuntimeError, OSError, BackendError) as e:
        raise BackendUnavailable(f"no usable NVIDIA driver here: {e}") from e
    return int(version)


class DriverError(BackendError):
    """A checkpoint call answered an error; `code` is its CUresult name."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class CheckpointDriver:
    """`cuCheckpointProcess*` on one PID at a time, each bounded by a deadline."""

    def __init__(
        self, driver: Any, lock_timeout_ms: int, call_timeout_s: float, copy_bytes_per_s: float
    ) -> None:
        self.driver = driver
        self.lock_timeout_ms = lock_timeout_ms
        self.call_timeout_s = call_timeout_s
        self.copy_bytes_per_s = copy_bytes_per_s

    def error_name(self, err: Any) -> str:
        """The CUresult's name, e.g. CUDA_ERROR_ILLEGAL_STATE."""
        try:
            _, name = self.driver.cuGetErrorName(err)
        except Exception:  # an unknown code: show the number
            return str(int(err))
        return name.decode() if isinstance(name, bytes) else str(name or int(err))

    def _call(self, seconds: float, call: str, pid: int, *args: Any) -> tuple[Any, ...]:
        fn = getattr(self.driver, call)
        what = f"{call} on pid {pid}"
        result: tuple[Any, ...] = call_with_deadline(seconds, what, fn, pid, *args)
        return result

    def _check(self, err: Any, call: str, pid: int) -> None:
        if err != self.driver.CUresult.CUDA_SUCCESS:
            code = self.error_name(err)
            raise DriverError(f"{call} on pid {pid} failed: {code}", code)

    def _copy_deadline(self, nbytes: int) -> float:
        return self.call_timeout_s + nbytes / self.copy_bytes_per_s

    def state(self, pid: int) -> int | None:
        """The process's checkpoint state; None if it has no CUDA state."""
        err, state = self._call(self.call_timeout_s, "cuCheckpointProcessGetState", pid)
        if err != self.driver.CUresult.CUDA_SUCCESS and self.error_name(err) in NO_CUDA_STATE:
            return None
        self._check(err, "cuCheckpointProcessGetState", pid)
        return int(state)

    def lock(self, pid: int) -> None:
        """RUNNING → LOCKED, waiting at most the lock timeout for in-flight work."""
        args = self.driver.CUcheckpointLockArgs()
        args.timeoutMs = self.lock_timeout_ms
        seconds = self.lock_timeout_ms / 1000 + self.call_timeout_s
        (err,) = self._call(seconds, "cuCheckpointProcessLock", pid, args)
        self._check(err, f"cuCheckpointProcessLock ({self.lock_timeout_ms} ms)", pid)

    def checkpoint(self, pid: int, nbytes: int) -> None:
        """LOCKED → CHECKPOINTED: device memory into the process's host memory."""
        seconds = self._copy_deadline(nbytes)
        (err,) = self._call(seconds, "cuCheckpointProcessCheckpoint", pid, None)
        self._check(err, "cuCheckpointProcessCheckpoint", pid)

    def restore(self, pid: int, nbytes: int) -> None:
        """CHECKPOINTED → LOCKED: memory back on the device at its old addresses."""
        seconds = self._copy_deadline(nbytes)
        (err,) = self._call(seconds, "cuCheckpointProcessRestore", pid, None)
        self._check(err, "cuCheckpointProcessRestore", pid)

    def unlock(self, pid: int) -> None:
        """LOCKED → RUNNING."""
        (err,) = self._call(self.call_timeout_s, "cuCheckpointProcessUnlock", pid, None)
        self._check(err, "cuCheckpointProcessUnlock", pid)
