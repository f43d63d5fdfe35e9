"""The cuda backend's move sequences over all of a tenant's processes: all of them move or none.

Park: lock each, then checkpoint each; a failure returns every touched process to RUNNING (a
lock that does not return in time, too: the tenant is then refused, as sharing GPU memory). A
process that only called cuInit (its lock answers NOT_INITIALIZED) has nothing on the device
and is left out.
Restore: restore each, then unlock each, then check each is RUNNING; a failed restore parks the
ones already brought back again. A process that exited while parked is left out (its memory
went with it) and the others are brought back. The functions raise `BackendQuarantined` (with
the reason only) when a process is left in a state the agent cannot fix, `Unparkable` when the
driver does not support checkpointing the processes, and `DriverError` for a failure that left
everything as it was.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.parking.backends.base import (
    BackendError,
    BackendQuarantined,
    RecordError,
    Unparkable,
)
from agent.parking.backends.cuda_driver import (
    CHECKPOINTED,
    FAILED,
    LOCKED,
    NOT_SUPPORTED,
    OUT_OF_MEMORY,
    POISONED,
    RUNNING,
    CheckpointDriver,
    DriverError,
    NoContext,
    state_name,
)
from agent.parking.backends.deadline import CallStalled

log = logging.getLogger(__name__)

Sizes = dict[int, dict[str, int]]
"""Per process, its bytes on each GPU."""


@dataclass
class ParkedProcs:
    """A parked tenant: each process's bytes per GPU; `confirmed` once the driver agreed."""

    pids: Sizes
    confirmed: bool = True

    def per_gpu(self) -> dict[str, int]:
        """Parked bytes per GPU."""
        out: dict[str, int] = {}
        for sizes in self.pids.values():
            for gpu, n in sizes.items():
                out[gpu] = out.get(gpu, 0) + n
        return out


SHARING = (
    "the driver cannot checkpoint processes that share GPU memory (NCCL, CUDA IPC) or use "
    "managed memory; the tenant stays resident"
)
UNSUPPORTED = (
    "the driver cannot checkpoint this process (some container runtimes, MIG instances); it "
    "stays resident: to park the tenant, give its pod another parking method "
    "(baton.dev/parking: app, with on_park/on_restore callbacks)"
)
STALLED = (
    "a lock that does not return means the tenant's processes share GPU memory (NCCL, CUDA "
    "IPC): the driver's calls on one wait while a peer is locked"
)


def _total(sizes: Sizes, pid: int) -> int:
    return sum(sizes.get(pid, {}).values())


Late = Callable[[], Callable[[], None]]
"""Called before an undo is left to a stalled call's thread (`roll_back`); what it returns is
called once that undo ran, or was not left after all."""


def _none_late() -> Callable[[], None]:
    return lambda: None


def park_all(
    calls: CheckpointDriver, pids: tuple[int, ...], sizes: Sizes, late: Late = _none_late
) -> tuple[int, ...]:
    """Lock every process, then checkpoint every one; undo all if one fails. Returns the ones
    parked: all but those without a CUDA context. `late`: see `roll_back`."""
    locked: list[int] = []
    for pid in pids:
        try:
            calls.lock(pid)
        except NoContext:
            continue
        except CallStalled as e:  # undone if it can be; the tenant cannot be parked
            roll_back(calls, [pid, *locked], sizes, e, late)
            raise Unparkable(f"{e}; {STALLED}; {SHARING}") from e
        except DriverError as e:
            roll_back(calls, [pid, *locked], sizes, e)
            if e.code == NOT_SUPPORTED:
                raise Unparkable(f"{e}: {SHARING}") from e
            raise
        locked.append(pid)
    for pid in locked:
        try:
            calls.checkpoint(pid, _total(sizes, pid))
        except DriverError as e:
            roll_back(calls, locked, sizes, e)
            if e.code == NOT_SUPPORTED:
                raise Unparkable(f"{e}: {SHARING}") from e
            raise
    return tuple(locked)


def roll_back(
    calls: CheckpointDriver,
    pids: list[int],
    sizes: Sizes,
    cause: Exception,
    late: Late = _none_late,
) -> None:
    """Return every touched process to RUNNING; `BackendQuarantined` if one will not go.

    `pids[0]` is the one `cause` came from, undone last. Where its call is still in flight (a
    lock that did not return in time) it is undone once the call returns: a lock waiting on a
    locked peer is carried out when the peer is unlocked (NVIDIA/cuda-checkpoint#30). `late`
    hears of that undo before it is left to the call, and once it ran (the caller keeps others
    from settling the process meanwhile)."""
    stuck = []
    for pid in reversed(pids):
        stalled = cause if isinstance(cause, CallStalled) and pid == pids[0] else None
        if stalled is not None:
            ran = late()
            if stalled.on_return(functools.partial(_undo_late, calls, pid, ran)):
                continue  # its peers are unlocked: it returns, and is undone then
            ran()
        try:
            state = calls.state(pid)
            if state == CHECKPOINTED:
                calls.restore(pid, _total(sizes, pid))
                state = calls.state(pid)
            if state == LOCKED:
                calls.unlock(pid)
                state = calls.state(pid)
            if state not in (RUNNING, None):
                stuck.append(f"pid {pid} is {state_name(state)}")
        except BackendError as e:
            stuck.append(str(e))
    if stuck:
        raise BackendQuarantined(
            f"park failed ({cause}) and could not be undone: " + "; ".join(stuck)
        )


def _undo_late(calls: CheckpointDriver, pid: int, ran: Callable[[], None]) -> None:
    try:
        unlock_late(calls, pid)
    finally:
        ran()


def unlock_late(calls: CheckpointDriver, pid: int) -> None:
    """After a lock that returned past its deadline: the process it locked is unlocked."""
    try:
        state = calls.state(pid)
        if state == LOCKED:
            calls.unlock(pid)
            state = calls.state(pid)
    except BackendError as e:
        log.error("pid %d, locked after its park was undone, could not be unlocked: %s", pid, e)
        return
    if state not in (RUNNING, None):
        log.error("pid %d, locked after its park was undone, is %s", pid, state_name(state))


def restore_all(calls: CheckpointDriver, sizes: Sizes) -> tuple[int, ...]:
    """Restore every process, then unlock every one; each must end RUNNING. One that exited
    meanwhile (the driver knows it no more) is left out: its memory went with it. Returns the
    processes brought back."""
    restored: list[int] = []
    for pid in sorted(sizes):
        try:
            calls.restore(pid, _total(sizes, pid))
        except DriverError as e:
            if _exited(calls, pid, e):
                continue
            park_again(calls, restored, sizes, e)
            if e.code in (OUT_OF_MEMORY, POISONED):
                raise BackendQuarantined(
                    f"{e}: the driver fails every later restore of a process whose restore ran "
                    "out of device memory, so it is not retried"
                ) from e
            state = calls.state(pid)
            if state != CHECKPOINTED:
                raise BackendQuarantined(f"{e}; pid {pid} is {state_name(state)}") from e
            raise
        restored.append(pid)
    stuck: list[str] = []
    for pid in list(restored):  # every one is tried: one that fails leaves none of the rest locked
        try:
            calls.unlock(pid)
        except DriverError as e:
            state = calls.state(pid)
            if state is not None:
                stuck.append(f"{e}; pid {pid} is {state_name(state)}")
            restored.remove(pid)
    if stuck:
        raise BackendQuarantined("; ".join(stuck))
    for pid in list(restored):
        state = calls.state(pid)
        if state is None:
            restored.remove(pid)
        elif state != RUNNING:
            raise BackendQuarantined(
                f"after its restore pid {pid} is {state_name(state)}, not running"
            )
    return tuple(restored)


def _exited(calls: CheckpointDriver, pid: int, failed: DriverError) -> bool:
    """Whether the process a call failed on has exited (an out-of-memory restore has not)."""
    if failed.code in (OUT_OF_MEMORY, POISONED):
        return False
    try:
        return calls.state(pid) is None
    except DriverError:
        return False


def park_again(
    calls: CheckpointDriver, restored: list[int], sizes: Sizes, cause: Exception
) -> None:
    """Checkpoint again the processes a failed restore had brought back (all or none)."""
    for pid in restored:
        try:
            calls.checkpoint(pid, _total(sizes, pid))
        except BackendError as e:
            raise BackendQuarantined(
                f"restore failed ({cause}) and pid {pid} could not be parked again: {e}"
            ) from e


def confirm(calls: CheckpointDriver, sizes: Sizes) -> Sizes:
    """The processes recorded as parked (before a restart) that the driver says still are.

    One left locked stopped mid-move with its memory on the device: beside a checkpointed
    sibling it is checkpointed too (the tenant stays parked, all or none), else unlocked."""
    states = {pid: calls.state(pid) for pid in sizes}
    for pid, state in states.items():
        if state == FAILED:
            raise BackendQuarantined(f"pid {pid} is in the driver's FAILED state")
    parked = CHECKPOINTED in states.values()
    still: Sizes = {}
    for pid, state in states.items():
        if state == LOCKED:
            settle_locked(calls, pid, parked, _total(sizes, pid))
        if state == CHECKPOINTED or (state == LOCKED and parked):
            still[pid] = sizes[pid]
    return still


def settle_locked(calls: CheckpointDriver, pid: int, parked: bool, nbytes: int) -> None:
    """A process found locked by a move a restart cut off: checkpointed if a sibling is
    (the move is finished as a park), else unlocked (its memory is on the device)."""
    if parked:
        calls.checkpoint(pid, nbytes)
    else:
        calls.unlock(pid)


def check_room(tenant_id: str, gpu: str, parked: int, headroom: int, free: int) -> None:
    """`BackendError` (retryable) unless `free` holds the parked bytes plus the headroom."""
    need = parked + headroom
    if free < need:
        raise BackendError(
            f"restoring {tenant_id} needs {need >> 20} MiB free on {gpu} "
            f"({parked >> 20} MiB parked + {headroom >> 20} MiB headroom); "
            f"NVML reports {free >> 20} MiB free"
        )


def durable(parked: dict[str, ParkedProcs], quarantined: dict[str, str]) -> dict[str, Any]:
    """What survives a restart: each tenant's parked processes and bytes, and its quarantine."""
    out: dict[str, Any] = {
        t: {"pids": {str(pid): dict(s) for pid, s in p.pids.items()}} for t, p in parked.items()
    }
    for t, why in quarantined.items():
        out.setdefault(t, {"pids": {}})["quarantined"] = why
    return out


def adopted(saved: Any) -> tuple[dict[str, ParkedProcs], dict[str, str]]:
    """`durable`'s output read back: parked processes (unconfirmed) and quarantines;
    `RecordError` naming the field for a record of another shape."""
    if not isinstance(saved, dict):
        raise RecordError(f"the cuda record is a JSON {type(saved).__name__}, not an object")
    parked, quarantined = {}, {}
    for tenant_id, entry in saved.items():
        where = f"tenant {tenant_id!r}"
        if not isinstance(entry, dict) or not isinstance(entry.get("pids"), dict):
            raise RecordError(f"{where}: not an object with a 'pids' object")
        pids = {_pid(where, p): _sizes(f"{where} pid {p}", s) for p, s in entry["pids"].items()}
        if pids:
            parked[tenant_id] = ParkedProcs(pids, confirmed=False)
        why = entry.get("quarantined", "")
        if not isinstance(why, str):
            raise RecordError(f"{where}: 'quarantined' is {why!r}, not a reason")
        if why:
            quarantined[tenant_id] = why
    return parked, quarantined


def _pid(where: str, text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) <= 0:
        raise RecordError(f"{where}: pid {text!r} is not a process ID")
    return int(text)


def _sizes(where: str, sizes: Any) -> dict[str, int]:
    """A parked process's bytes per GPU."""
    if not isinstance(sizes, dict):
        raise RecordError(f"{where}: not an object of bytes per GPU")
    for gpu, n in sizes.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise RecordError(f"{where}: bytes on {gpu} are {n!r}, not a count of bytes")
    return dict(sizes)
