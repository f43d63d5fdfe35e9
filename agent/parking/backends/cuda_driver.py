"""The driver's checkpoint calls for one process each, with deadlines and named errors.

Each call runs through `deadline.call_with_deadline`: lock gets its own timeout plus the call
timeout; checkpoint and restore get the call timeout plus the time to copy their bytes at the
slowest copy rate assumed. A state query that answers "not initialized" or "invalid value" means
the process has no CUDA state (no context yet, or it is gone), not an error. A process caught
mid-checkpoint or mid-restore (states 4 and 5) is asked again until it settles; bindings older
than 13.4 cannot name those states and raise ValueError ("4 is not a valid CUprocessState"),
read here as the state it names. Any other answer the bindings cannot read (a state or result
code newer than them: ValueError or KeyError) is an `UnreadableAnswer` naming the call.

What is checked at start: every checkpoint call is in the bindings (cuda-bindings 13.0.0 and
13.0.1 lack `cuCheckpointProcessRestore`), the bindings release the GIL inside the calls
(cuda-python 12.9.1 and later; 12.8.0 and 12.9.0 hold it, so no deadline could fire), and the
driver is 575.57 or newer (PyTorch processes fail to checkpoint on 570.x).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

from agent.parking.backends.base import BackendError, BackendUnavailable
from agent.parking.backends.deadline import CallStalled, call_with_deadline

INSTALL_HINT = "the cuda backend needs cuda-python and nvidia-ml-py: pip install 'baton-gpu[cuda]'"
MIN_DRIVER_API = 12080
"""cuCheckpointProcess* with a lock timeout: CUDA 12.8 driver API."""
LOCK_TIMEOUT_MAX_MS = 2**32 - 1
"""The most `CUcheckpointLockArgs.timeoutMs` (an unsigned int) holds; 0 there is no timeout."""
MIN_DRIVER = (575, 57)
"""NVIDIA driver 575.57: PyTorch processes fail to checkpoint on 570.x (cuda-checkpoint#34)."""
MIN_BINDINGS = (12, 9, 1)
"""cuda-python 12.8.0 and 12.9.0 hold the GIL inside the checkpoint calls."""
CALLS = (
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
)
RUNNING, LOCKED, CHECKPOINTED, FAILED, CHECKPOINTING, RESTORING = 0, 1, 2, 3, 4, 5
STATE_NAMES = {
    RUNNING: "running",
    LOCKED: "locked",
    CHECKPOINTED: "checkpointed",
    FAILED: "failed",
    CHECKPOINTING: "checkpointing",
    RESTORING: "restoring",
}
SETTLING = (CHECKPOINTING, RESTORING)
"""States a process passes through during a move made by another caller: ask again."""
SETTLE_POLL_S = 0.05
NO_CUDA_STATE = ("CUDA_ERROR_NOT_INITIALIZED", "CUDA_ERROR_INVALID_VALUE")
NOT_INITIALIZED = "CUDA_ERROR_NOT_INITIALIZED"
"""A lock's answer for a process that only called cuInit: it has no context, nothing to move."""
OUT_OF_MEMORY = "CUDA_ERROR_OUT_OF_MEMORY"
POISONED = "CUDA_ERROR_OPERATING_SYSTEM"
"""A restore's answer for a process whose earlier restore ran out of device memory."""
NOT_SUPPORTED = "CUDA_ERROR_NOT_SUPPORTED"
UNREADABLE = "UNREADABLE_ANSWER"
"""The code of an answer the bindings could not read."""


def state_name(state: int | None) -> str:
    """A process state as a word ("gone" for a process without CUDA state)."""
    return "gone" if state is None else STATE_NAMES.get(state, f"state {state}")


def lock_timeout_ms(seconds: float) -> int:
    """`--move-timeout` as the lock's whole milliseconds, rounded up: one under a millisecond
    must not become 0, the driver's "no timeout"; `BackendUnavailable` past what it holds."""
    if not 0 < seconds * 1000 <= LOCK_TIMEOUT_MAX_MS:
        raise BackendUnavailable(
            f"--move-timeout {seconds:g}: the driver's checkpoint lock waits at most "
            f"{LOCK_TIMEOUT_MAX_MS // 1000} s (its timeout is 32-bit milliseconds)"
        )
    return max(1, math.ceil(round(seconds * 1000, 6)))


def load_modules() -> tuple[Any, Any]:
    """Import `cuda.bindings.driver` and `pynvml`, or say how to install them."""
    try:
        import pynvml
        from cuda.bindings import driver
    except ImportError as e:
        raise BackendUnavailable(f"{INSTALL_HINT} ({e})") from e
    return driver, pynvml


def bindings_version() -> str:
    """The installed cuda-bindings (or, before 12.6, cuda-python) version; "" if unknown."""
    for dist in ("cuda-bindings", "cuda-python"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return ""


def _numbers(version: str) -> tuple[int, ...]:
    """The leading numbers of a version: "12.9.1.post1" → (12, 9, 1), "580.95.05" → (580, 95, 5)."""
    out = []
    for part in version.split("."):
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def check_bindings(driver: Any, version: str) -> None:
    """`BackendUnavailable` naming the version if the bindings lack a call or hold the GIL."""
    named = f"cuda-bindings {version}" if version else "these CUDA bindings"
    missing = [c for c in CALLS if not hasattr(driver, c)]
    if missing:
        raise BackendUnavailable(
            f"{named} lack {', '.join(missing)} (13.0.0 and 13.0.1 have no restore); "
            f"install cuda-bindings 12.9.5+ or 13.0.2+"
        )
    if version and _numbers(version) < MIN_BINDINGS:
        raise BackendUnavailable(
            f"{named} hold the GIL inside the checkpoint calls, so a stuck lock would freeze the "
            f"agent; {INSTALL_HINT} (cuda-python 12.9.1 or newer)"
        )


def check_driver_release(nvml: Any) -> str:
    """The NVIDIA driver's version from NVML; `BackendUnavailable` below 575.57."""
    release = nvml.nvmlSystemGetDriverVersion()
    release = release.decode() if isinstance(release, bytes) else str(release)
    if _numbers(release) < MIN_DRIVER:
        raise BackendUnavailable(
            f"the cuda backend needs NVIDIA driver 575.57 or newer (570.x fails to checkpoint "
            f"PyTorch processes); this node runs {release}"
        )
    return release


def nvml_error(nvml: Any) -> type[Exception]:
    """The exception type the NVML module raises (`pynvml.NVMLError`)."""
    found = getattr(nvml, "NVMLError", None)
    return found if isinstance(found, type) and issubclass(found, Exception) else RuntimeError


def check_driver(driver: Any, nvml: Any, error_name: Callable[[Any], str]) -> int:
    """The driver API version; raises `BackendUnavailable` saying what is needed."""
    try:
        err, version = driver.cuDriverGetVersion()
        if err != driver.CUresult.CUDA_SUCCESS:
            raise BackendError(f"cuDriverGetVersion failed: {error_name(err)}")
        if version < MIN_DRIVER_API:
            raise BackendUnavailable(
                f"the cuda backend needs NVIDIA driver 575.57 or newer (CUDA 12.8 driver API); "
                f"this driver supports CUDA {version // 1000}.{version % 1000 // 10}"
            )
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise BackendError(f"cuInit failed: {error_name(err)}")
        nvml.nvmlInit()
        check_driver_release(nvml)
    except BackendUnavailable:
        raise
    except (RuntimeError, OSError, BackendError, nvml_error(nvml)) as e:
        raise BackendUnavailable(f"no usable NVIDIA driver here: {e}") from e
    return int(version)


class DriverError(BackendError):
    """A checkpoint call answered an error; `code` is its CUresult name."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class NoContext(DriverError):
    """The process called cuInit but made no CUDA context: it holds nothing to move."""


class UnreadableAnswer(DriverError):
    """The bindings raised reading the driver's answer (a state or result code newer than
    them); `state` is the process state it named, if it was one."""

    def __init__(self, what: str, error: Exception) -> None:
        super().__init__(
            f"{what} answered what these CUDA bindings cannot read ({error}); "
            "install cuda-bindings as new as the driver",
            UNREADABLE,
        )
        head = str(error).split(" ", 1)[0]
        named_state = "CUprocessState" in str(error) and head.isdigit()
        self.state = int(head) if named_state else None


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
        try:
            result: tuple[Any, ...] = call_with_deadline(seconds, what, fn, pid, *args)
        except (ValueError, KeyError) as e:  # the bindings' enums do not know the answer
            raise UnreadableAnswer(what, e) from e
        return result

    def _check(self, err: Any, call: str, pid: int) -> None:
        if err != self.driver.CUresult.CUDA_SUCCESS:
            code = self.error_name(err)
            raise DriverError(f"{call} on pid {pid} failed: {code}", code)

    def _copy_deadline(self, nbytes: int) -> float:
        return self.call_timeout_s + nbytes / self.copy_bytes_per_s

    def state(self, pid: int) -> int | None:
        """The process's settled checkpoint state; None if it has no CUDA state.

        A process mid-checkpoint or mid-restore is asked again until it leaves that state;
        `CallStalled` if it has not within the call timeout."""
        deadline = time.monotonic() + self.call_timeout_s
        while True:
            state = self._state_once(pid)
            if state not in SETTLING:
                return state
            if time.monotonic() >= deadline:
                raise CallStalled(
                    f"pid {pid} stayed {state_name(state)} for {self.call_timeout_s:g} s"
                )
            time.sleep(SETTLE_POLL_S)

    def _state_once(self, pid: int) -> int | None:
        try:
            err, state = self._call(self.call_timeout_s, "cuCheckpointProcessGetState", pid)
        except UnreadableAnswer as e:
            if e.state in SETTLING:  # bindings before 13.4 cannot name states 4 and 5
                return e.state
            raise
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
        if err != self.driver.CUresult.CUDA_SUCCESS and self.error_name(err) == NOT_INITIALIZED:
            raise NoContext(f"pid {pid} has no CUDA context (only cuInit)", NOT_INITIALIZED)
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
