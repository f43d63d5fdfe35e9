"""GPU health: critical XID errors mark a GPU's slots Unhealthy.

The NVML event loop feeds real XIDs; the fake backend is told of XIDs over HTTP
(`POST /fake/xid` on the metrics port, see `metrics.py`). Both go through `HealthTracker`.
A GPU whose events NVML does not deliver is Unhealthy ("health unknown") until it does again;
one whose NVML answers that it does not support XID events at all stays Healthy, unwatched.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from nodegpu.state import LiveInventory

log = logging.getLogger(__name__)

DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68, 109)
"""Application-caused XIDs that do not mean the GPU is broken (as NVIDIA's plugin ignores)."""

_NVML_WAIT_MS = 5000
FIRST_RETRY_S = 1.0
MAX_RETRY_S = 30.0
UNKNOWN = "health unknown"
"""How an Unhealthy GPU's reason starts when NVML does not report its events."""


def parse_xid_list(text: str) -> frozenset[int]:
    """`13,31,43` → {13, 31, 43}; empty text → nothing ignored."""
    try:
        return frozenset(int(part) for part in text.split(",") if part.strip())
    except ValueError as err:
        raise ValueError(f"--ignored-xids {text!r} must be comma-separated integers") from err


def is_critical_xid(xid: int, ignored: frozenset[int]) -> bool:
    """Whether an XID means the GPU should no longer be offered."""
    return xid not in ignored


class HealthTracker:
    """Applies XID events to the live inventory."""

    def __init__(self, inventory: LiveInventory, ignored: frozenset[int]) -> None:
        self.inventory = inventory
        self.ignored = ignored

    def resolve(self, ref: str) -> str:
        """A GPU UUID from a UUID or an index; KeyError when there is no such GPU."""
        _, inventory = self.inventory.snapshot()
        for gpu in inventory.gpus:
            if ref in (gpu.uuid, str(gpu.index)):
                return gpu.uuid
        raise KeyError(f"no GPU {ref!r} on this node")

    def on_xid(self, uuid: str, xid: int) -> bool:
        """Record an XID on a GPU; True when it turned the GPU unhealthy."""
        if not is_critical_xid(xid, self.ignored):
            log.info("GPU %s reported XID %d (ignored: application-caused)", uuid, xid)
            return False
        changed = self.inventory.set_health(uuid, False, f"XID {xid}")
        if changed:
            log.warning("GPU %s reported critical XID %d: its slots are now Unhealthy", uuid, xid)
        return changed

    def set_healthy(self, uuid: str) -> bool:
        """Mark a GPU healthy again (an operator's or a test's decision)."""
        return self.inventory.set_health(uuid, True)


class NvmlHealthLoop:
    """Waits on NVML XidCriticalError events for every GPU and feeds them to the tracker.

    A GPU whose events NVML does not deliver (NVML failed, or the GPU's events cannot be
    registered) has unknown health: the loop marks it Unhealthy, says why once, and tries again
    with backoff; once NVML answers for it again, a GPU the loop marked is Healthy again (one an
    XID failed stays Unhealthy).
    """

    def __init__(
        self,
        tracker: HealthTracker,
        failed: Callable[[], None] = lambda: None,
        first_retry_s: float | None = None,
    ) -> None:
        """`failed` is called on every failed attempt (a metric); retries wait `first_retry_s`
        (default `FIRST_RETRY_S`), doubled after each failure up to `MAX_RETRY_S`."""
        self.tracker = tracker
        self._failed = failed
        self._first_retry_s = FIRST_RETRY_S if first_retry_s is None else first_retry_s
        self._lock = threading.Lock()
        self._unwatched: dict[str, str] = {}
        """GPU UUID -> why NVML does not report its events now."""
        self._marked: set[str] = set()
        """The GPUs this loop made Unhealthy because their health is unknown."""
        self._answered = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-health", daemon=True)

    def start(self) -> None:
        """Start the event loop thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current wait (at most 5 s); a wait between retries ends at once."""
        self._stop.set()

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the stopped loop to end; True when it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def unwatched(self) -> int:
        """How many GPUs' health NVML does not report now."""
        with self._lock:
            return len(self._unwatched)

    def problem(self) -> str | None:
        """Why some GPU's health is not watched (for `/readyz`), or None."""
        with self._lock:
            unwatched = sorted(self._unwatched.items())
        if not unwatched:
            return None
        return f"health of {len(unwatched)} GPU(s) not watched: {unwatched[0][1]}; retrying"

    def _run(self) -> None:
        import pynvml

        delay = self._first_retry_s
        while not self._stop.is_set():
            self._answered = False
            try:
                self._watch(pynvml)
                return
            except Exception as err:  # NVML's errors and any other: said, retried, never fatal
                why = str(err) if isinstance(err, _NvmlFailed) else f"{type(err).__name__}: {err}"
                log.debug("NVML health watch failed", exc_info=True)
            if self._answered:  # the watch worked before it failed: start the backoff over
                delay = self._first_retry_s
            gpus = [g.uuid for g in self.tracker.inventory.snapshot()[1].gpus]
            self._unwatch(gpus, why, delay)
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, MAX_RETRY_S)

    def _watch(self, nv: Any) -> None:
        """Watch until stopped; _NvmlFailed (or a bug's exception) when NVML fails."""
        _call(nv, "nvmlInit")
        try:
            events = _call(nv, "nvmlEventSetCreate")
            try:
                self._wait_events(nv, events)
            finally:
                _quietly(nv, "nvmlEventSetFree", events)
        finally:
            _quietly(nv, "nvmlShutdown")

    def _wait_events(self, nv: Any, events: Any) -> None:
        by_handle: dict[int | None, str] = {}
        pending = [g.uuid for g in self.tracker.inventory.snapshot()[1].gpus]
        delay, retry_at = self._first_retry_s, 0.0
        while not self._stop.is_set():
            wait_ms = _NVML_WAIT_MS
            if pending:
                if time.monotonic() >= retry_at:
                    pending = self._register(nv, events, pending, by_handle, delay)
                    retry_at = time.monotonic() + delay
                    delay = min(delay * 2, MAX_RETRY_S)
                wait_ms = max(1, min(wait_ms, math.ceil((retry_at - time.monotonic()) * 1000)))
            try:
                data = nv.nvmlEventSetWait(events, wait_ms)
            except nv.NVMLError_Timeout:
                data = None
            except nv.NVMLError as err:
                raise _NvmlFailed(f"nvmlEventSetWait failed: {err}") from None
            self._answered = True
            self._watching(by_handle.values())
            if data is not None and data.eventType == nv.nvmlEventTypeXidCriticalError:
                failed = by_handle.get(_handle_key(data.device))
                if failed:
                    self.tracker.on_xid(failed, int(data.eventData))

    def _register(
        self,
        nv: Any,
        events: Any,
        uuids: list[str],
        by_handle: dict[int | None, str],
        retry_s: float,
    ) -> list[str]:
        """Register each GPU's XID events; the GPUs that failed (Unhealthy, retried)."""
        pending: list[str] = []
        for uuid in uuids:
            try:
                handle = nv.nvmlDeviceGetHandleByUUID(uuid)
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, events)
            except _not_supported(nv) as err:  # no retry will change it: Healthy, unwatched
                log.warning("GPU %s cannot report XID events (%s): health not watched", uuid, err)
                self._watching([uuid])  # NVML answered: health unknown no longer, if it was
                continue
            except nv.NVMLError as err:
                self._unwatch([uuid], f"its XID events cannot be registered ({err})", retry_s)
                pending.append(uuid)
                continue
            by_handle[_handle_key(handle)] = uuid
        return pending

    def _unwatch(self, uuids: list[str], why: str, retry_s: float) -> None:
        """These GPUs' health is unknown: Unhealthy, said once, retried in `retry_s`."""
        with self._lock:
            news = any(self._unwatched.get(uuid) != why for uuid in uuids)
            self._unwatched.update(dict.fromkeys(uuids, why))
        self._failed()
        for uuid in uuids:
            if self.tracker.inventory.set_health(uuid, False, f"{UNKNOWN}: {why}"):
                self._marked.add(uuid)
        which = f"GPU {uuids[0]} is" if len(uuids) == 1 else f"all {len(uuids)} GPUs are"
        (log.warning if news else log.debug)(
            "GPU health watch: %s; %s Unhealthy (health unknown) until NVML reports on them "
            "again; retrying in %.1f s",
            why,
            which,
            retry_s,
        )

    def _watching(self, uuids: Iterable[str]) -> None:
        """NVML answered for these GPUs: those this loop marked are Healthy again."""
        with self._lock:
            back = [uuid for uuid in uuids if self._unwatched.pop(uuid, None) is not None]
        for uuid in back:
            if uuid in self._marked:
                self._marked.discard(uuid)
                self.tracker.inventory.set_health(uuid, True)
            log.info("GPU health watch: NVML reports GPU %s again; it is Healthy", uuid)


def _not_supported(nv: Any) -> type[Exception] | tuple[()]:
    """NVML's "not supported" error (a GPU too old or virtualised for XID events), if the
    bindings name it."""
    found = getattr(nv, "NVMLError_NotSupported", None)
    return found if isinstance(found, type) and issubclass(found, Exception) else ()


class _NvmlFailed(Exception):
    """An NVML call the whole watch needs failed; the message names the call."""


def _call(nv: Any, name: str, *args: Any) -> Any:
    try:
        return getattr(nv, name)(*args)
    except nv.NVMLError as err:
        raise _NvmlFailed(f"{name} failed: {err}") from None


def _quietly(nv: Any, name: str, *args: Any) -> None:
    """A clean-up call whose failure changes nothing (the next attempt starts afresh)."""
    try:
        getattr(nv, name)(*args)
    except nv.NVMLError as err:
        log.debug("GPU health watch: %s failed: %s", name, err)


def _handle_key(handle: Any) -> int | None:
    """NVML device handles are ctypes pointers; their address identifies the device."""
    return ctypes.cast(handle, ctypes.c_void_p).value
