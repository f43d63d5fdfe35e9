"""GPU health: critical XID errors mark a GPU's slots Unhealthy.

The NVML event loop feeds real XIDs; the fake backend is told of XIDs over HTTP
(`POST /fake/xid` on the metrics port, see `metrics.py`). Both go through `HealthTracker`.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

from nodegpu.state import LiveInventory

log = logging.getLogger(__name__)

DEFAULT_IGNORED_XIDS = (13, 31, 43, 45, 68, 109)
"""Application-caused XIDs that do not mean the GPU is broken (as NVIDIA's plugin ignores)."""

_NVML_WAIT_MS = 5000


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
    """Waits on NVML XidCriticalError events for every GPU and feeds them to the tracker."""

    def __init__(self, tracker: HealthTracker) -> None:
        self.tracker = tracker
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-health", daemon=True)

    def start(self) -> None:
        """Start the event loop thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current wait (at most 5 s)."""
        self._stop.set()

    def _run(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        events = pynvml.nvmlEventSetCreate()
        try:
            by_handle = self._register(pynvml, events)
            while not self._stop.is_set():
                try:
                    data = pynvml.nvmlEventSetWait(events, _NVML_WAIT_MS)
                except pynvml.NVMLError_Timeout:
                    continue
                except pynvml.NVMLError as err:
                    log.error("NVML event wait failed (%s): marking every GPU unhealthy", err)
                    for uuid in by_handle.values():
                        self.tracker.inventory.set_health(uuid, False, f"NVML error: {err}")
                    return
                if data.eventType == pynvml.nvmlEventTypeXidCriticalError:
                    failed = by_handle.get(_handle_key(data.device))
                    if failed:
                        self.tracker.on_xid(failed, int(data.eventData))
        finally:
            pynvml.nvmlEventSetFree(events)
            pynvml.nvmlShutdown()

    def _register(self, nv: Any, events: Any) -> dict[int | None, str]:
        by_handle: dict[int | None, str] = {}
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            uuid = nv.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            try:
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, events)
            except nv.NVMLError as err:
                log.warning("GPU %s cannot report XID events (%s): health not watched", uuid, err)
                continue
            by_handle[_handle_key(handle)] = uuid
        return by_handle


def _handle_key(handle: Any) -> int | None:
    """NVML device handles are ctypes pointers; their address identifies the device."""
    return ctypes.cast(handle, ctypes.c_void_p).value
