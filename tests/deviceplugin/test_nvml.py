"""The NVML adapters (discovery, XID event loop) against a stand-in `pynvml` module.

No GPU here: the stand-in answers the calls nvidia-ml-py exposes, with ctypes pointers as
device handles like the real bindings, and XID events fed from a queue.
"""

from __future__ import annotations

import ctypes
import queue
import sys
import types
from dataclasses import dataclass
from typing import Any

import pytest

from nodegpu.gpus import discover
from nodegpu.health import DEFAULT_IGNORED_XIDS, HealthTracker, NvmlHealthLoop
from nodegpu.inventory import Inventory, NodeGpu
from nodegpu.state import LiveInventory

UUIDS = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"]
XID_CRITICAL = 0x8


class NVMLError(Exception):
    pass


class NVMLError_Timeout(NVMLError):
    pass


@dataclass
class EventData:
    device: object
    eventType: int
    eventData: int


def stand_in_pynvml() -> tuple[types.ModuleType, queue.Queue]:
    events: queue.Queue = queue.Queue()
    cells = [ctypes.c_int(i) for i in range(len(UUIDS))]
    handles = [ctypes.pointer(cell) for cell in cells]
    nv: Any = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError
    nv.NVMLError_Timeout = NVMLError_Timeout
    nv.nvmlEventTypeXidCriticalError = XID_CRITICAL
    nv.nvmlInit = lambda: None
    nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: len(UUIDS)
    # a fresh pointer object per call, as the real bindings return
    nv.nvmlDeviceGetHandleByIndex = lambda i: ctypes.pointer(cells[i])
    nv.nvmlDeviceGetUUID = lambda h: UUIDS[h.contents.value]
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H200"
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=143771 * 1024 * 1024)
    nv.nvmlEventSetCreate = lambda: "event-set"
    nv.nvmlDeviceRegisterEvents = lambda h, mask, es: None
    nv.nvmlEventSetFree = lambda es: None

    def wait(es, timeout_ms):
        try:
            return events.get(timeout=0.05)
        except queue.Empty:
            raise NVMLError_Timeout() from None

    nv.nvmlEventSetWait = wait
    nv.handles = handles
    return nv, events


@pytest.fixture
def nvml(monkeypatch):
    nv, events = stand_in_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    return nv, events


def test_discovery_reads_uuid_name_and_memory(nvml):
    gpus, fake = discover(None, "node-a")
    assert not fake
    assert gpus == [
        NodeGpu(UUIDS[0], 0, "NVIDIA H200", 143771),
        NodeGpu(UUIDS[1], 1, "NVIDIA H200", 143771),
    ]


def test_critical_xid_marks_that_gpu_unhealthy_and_ignored_ones_do_not(nvml):
    nv, events = nvml
    live = LiveInventory(Inventory((NodeGpu(UUIDS[0], 0, "m", 1), NodeGpu(UUIDS[1], 1, "m", 1)), 4))
    loop = NvmlHealthLoop(HealthTracker(live, frozenset(DEFAULT_IGNORED_XIDS)))
    loop.start()
    try:
        events.put(EventData(ctypes.pointer(nv.handles[0].contents), XID_CRITICAL, 43))
        events.put(EventData(ctypes.pointer(nv.handles[1].contents), XID_CRITICAL, 79))
        update = live.wait_newer(0, lambda: False, timeout=5)
        assert update is not None
        assert dict(update[1].unhealthy) == {UUIDS[1]: "XID 79"}
    finally:
        loop.stop()
