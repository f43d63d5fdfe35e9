"""The NVML adapters (discovery, XID event loop) against a stand-in `pynvml` module.

No GPU here: the stand-in answers the calls nvidia-ml-py exposes, with ctypes pointers as
device handles like the real bindings, XID events fed from a queue, and calls that fail while
the test says so.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import queue
import sys
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from nodegpu import health
from nodegpu.gpus import discover
from nodegpu.health import DEFAULT_IGNORED_XIDS, HealthTracker, NvmlHealthLoop
from nodegpu.inventory import Inventory, NodeGpu
from nodegpu.node import NodeGpus, NodeSettings
from nodegpu.state import LiveInventory
from tests.harness.agent import http_get

WAIT_S = 10.0
UUIDS = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"]
XID_CRITICAL = 0x8


class NVMLError(Exception):
    pass


class NVMLError_Timeout(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


@dataclass
class EventData:
    device: object
    eventType: int
    eventData: int


def stand_in_pynvml() -> tuple[types.ModuleType, queue.Queue]:
    """The module and its event queue; `nv.broken[call] = "why"` fails that call until
    removed (`nvmlDeviceRegisterEvents:<uuid>` for one GPU's), `nv.calls` counts the calls."""
    events: queue.Queue = queue.Queue()
    cells = [ctypes.c_int(i) for i in range(len(UUIDS))]
    handles = [ctypes.pointer(cell) for cell in cells]
    nv: Any = types.ModuleType("pynvml")
    nv.broken = {}
    nv.calls = collections.Counter()
    nv.called = threading.Condition()

    def call(name: str, answer: Callable[..., Any]) -> Callable[..., Any]:
        def called(*args: Any) -> Any:
            with nv.called:
                nv.calls[name] += 1
                nv.called.notify_all()
            gpu = f"{name}:{UUIDS[args[0].contents.value]}" if name.endswith("Events") else ""
            why = nv.broken.get(name) or nv.broken.get(gpu)
            if isinstance(why, Exception):
                raise why
            if why:
                raise NVMLError(why)
            return answer(*args)

        return called

    nv.NVMLError = NVMLError
    nv.NVMLError_Timeout = NVMLError_Timeout
    nv.NVMLError_NotSupported = NVMLError_NotSupported
    nv.nvmlEventTypeXidCriticalError = XID_CRITICAL
    nv.nvmlInit = call("nvmlInit", lambda: None)
    nv.nvmlShutdown = call("nvmlShutdown", lambda: None)
    nv.nvmlDeviceGetCount = lambda: len(UUIDS)
    # a fresh pointer object per call, as the real bindings return
    nv.nvmlDeviceGetHandleByIndex = lambda i: ctypes.pointer(cells[i])
    nv.nvmlDeviceGetHandleByUUID = lambda u: ctypes.pointer(cells[UUIDS.index(u)])
    nv.nvmlDeviceGetUUID = lambda h: UUIDS[h.contents.value]
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H200"
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=143771 * 1024 * 1024)
    nv.nvmlEventSetCreate = call("nvmlEventSetCreate", lambda: "event-set")
    nv.nvmlDeviceRegisterEvents = call("nvmlDeviceRegisterEvents", lambda h, mask, es: None)
    nv.nvmlEventSetFree = call("nvmlEventSetFree", lambda es: None)

    def wait(es, timeout_ms):
        try:
            return events.get(timeout=min(timeout_ms / 1000, 0.05))
        except queue.Empty:
            raise NVMLError_Timeout() from None

    nv.nvmlEventSetWait = call("nvmlEventSetWait", wait)
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
        assert loop.join(WAIT_S)


def _gpus() -> tuple[NodeGpu, ...]:
    return (NodeGpu(UUIDS[0], 0, "m", 1), NodeGpu(UUIDS[1], 1, "m", 1))


def _wait_for(live: LiveInventory, reached: Callable[[dict[str, str]], bool]) -> None:
    """Until the unhealthy GPUs (uuid -> reason) are as `reached` wants, bounded."""
    deadline = time.monotonic() + WAIT_S
    version, inventory = live.snapshot()
    while not reached(dict(inventory.unhealthy)):
        left = deadline - time.monotonic()
        assert left > 0, f"unhealthy GPUs stayed {dict(inventory.unhealthy)}"
        update = live.wait_newer(version, lambda: False, left)
        if update is not None:
            version, inventory = update


def _wait_calls(nv: Any, name: str, count: int) -> None:
    with nv.called:
        assert nv.called.wait_for(lambda: nv.calls[name] >= count, WAIT_S), dict(nv.calls)


def test_nvml_that_fails_at_start_is_said_reported_and_retried_until_it_answers(
    nvml, monkeypatch, caplog
):
    nv, _ = nvml
    monkeypatch.setattr(health, "FIRST_RETRY_S", 0.01)
    nv.broken["nvmlInit"] = "Driver Not Loaded"
    settings = NodeSettings(node_name="n1", metrics_host="127.0.0.1", metrics_port=0)
    node = NodeGpus(settings, _gpus(), False, None, lambda: None)
    base = f"http://127.0.0.1:{node.status.port}"
    caplog.set_level(logging.DEBUG, logger="nodegpu.health")
    node.start()
    try:
        unknown = "health unknown: nvmlInit failed: Driver Not Loaded"
        _wait_for(node.inventory, lambda bad: bad == dict.fromkeys(UUIDS, unknown))
        _wait_calls(nv, "nvmlInit", 3)
        status, body = http_get(base + "/readyz", timeout=5)
        assert status == 503
        assert "not ready: health of 2 GPU(s) not watched: nvmlInit failed" in body
        metrics = http_get(base + "/metrics", timeout=5)[1]
        assert "baton_deviceplugin_unwatched_gpus 2.0" in metrics
        assert "baton_deviceplugin_unhealthy_gpus 2.0" in metrics
        warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warned) == 1 and "\n" not in warned[0].getMessage()
        assert "nvmlInit failed: Driver Not Loaded; all 2 GPUs are Unhealthy" in warned[0].message
        failures = node.metrics.registry.get_sample_value(
            "baton_deviceplugin_health_watch_failures_total"
        )
        assert failures is not None and failures >= 3

        nv.broken.clear()
        _wait_for(node.inventory, lambda bad: not bad)
        assert http_get(base + "/readyz", timeout=5) == (200, "ok\n")
        assert "baton_deviceplugin_unwatched_gpus 0.0" in http_get(base + "/metrics")[1]
    finally:
        node.stop()
        assert node.nvml is not None and node.nvml.join(WAIT_S)


def test_a_failed_event_wait_is_retried_and_only_gpus_of_unknown_health_come_back(nvml):
    nv, events = nvml
    live = LiveInventory(Inventory(_gpus(), 4))
    loop = NvmlHealthLoop(HealthTracker(live, frozenset(DEFAULT_IGNORED_XIDS)), first_retry_s=0.01)
    loop.start()
    try:
        events.put(EventData(nv.handles[1], XID_CRITICAL, 79))
        _wait_for(live, lambda bad: bad == {UUIDS[1]: "XID 79"})
        nv.broken["nvmlEventSetWait"] = "Unknown Error"
        unknown = "health unknown: nvmlEventSetWait failed: Unknown Error"
        _wait_for(live, lambda bad: bad == {UUIDS[0]: unknown, UUIDS[1]: "XID 79"})
        _wait_calls(nv, "nvmlEventSetFree", 2)
        assert nv.calls["nvmlShutdown"] >= 2  # each failed attempt let NVML go

        del nv.broken["nvmlEventSetWait"]
        _wait_for(live, lambda bad: bad == {UUIDS[1]: "XID 79"})
        assert loop.problem() is None
        events.put(EventData(nv.handles[0], XID_CRITICAL, 48))  # still watched
        _wait_for(live, lambda bad: bad == {UUIDS[0]: "XID 48", UUIDS[1]: "XID 79"})
    finally:
        loop.stop()
        assert loop.join(WAIT_S)


def test_a_gpu_whose_events_cannot_be_registered_is_unhealthy_until_they_can(nvml):
    nv, events = nvml
    nv.broken[f"nvmlDeviceRegisterEvents:{UUIDS[0]}"] = "GPU is lost"
    live = LiveInventory(Inventory(_gpus(), 4))
    loop = NvmlHealthLoop(HealthTracker(live, frozenset(DEFAULT_IGNORED_XIDS)), first_retry_s=0.01)
    loop.start()
    try:
        why = "its XID events cannot be registered (GPU is lost)"
        _wait_for(live, lambda bad: bad == {UUIDS[0]: f"health unknown: {why}"})
        _wait_calls(nv, "nvmlDeviceRegisterEvents", 4)  # GPU 1 once, GPU 0 retried
        assert loop.problem() == f"health of 1 GPU(s) not watched: {why}; retrying"
        events.put(EventData(nv.handles[1], XID_CRITICAL, 79))  # the other GPU is watched
        _wait_for(live, lambda bad: UUIDS[1] in bad)

        nv.broken.clear()
        _wait_for(live, lambda bad: bad == {UUIDS[1]: "XID 79"})
        assert nv.calls["nvmlInit"] == 1  # one GPU's retries leave the others' watch alone
    finally:
        loop.stop()
        assert loop.join(WAIT_S)


def test_a_gpu_that_cannot_report_xid_events_at_all_stays_healthy_and_unwatched(nvml):
    # "not supported" (a GPU too old or virtualised for them) is no failure a retry mends
    nv, events = nvml
    nv.broken[f"nvmlDeviceRegisterEvents:{UUIDS[0]}"] = NVMLError_NotSupported("Not Supported")
    live = LiveInventory(Inventory(_gpus(), 4))
    loop = NvmlHealthLoop(HealthTracker(live, frozenset(DEFAULT_IGNORED_XIDS)), first_retry_s=0.01)
    loop.start()
    try:
        events.put(EventData(nv.handles[1], XID_CRITICAL, 79))  # the other GPU is watched
        _wait_for(live, lambda bad: bad == {UUIDS[1]: "XID 79"})
        assert nv.calls["nvmlDeviceRegisterEvents"] == 2  # once each: GPU 0 is not retried
        assert loop.problem() is None and loop.unwatched() == 0
    finally:
        loop.stop()
        assert loop.join(WAIT_S)


@pytest.mark.parametrize("failing", ["nvmlInit", "nvmlEventSetWait"])
def test_a_gpu_that_cannot_report_xid_events_is_healthy_again_once_nvml_answers(nvml, failing):
    # NVML down at start (its driver not loaded yet) or failing later marks every GPU's health
    # unknown; once NVML answers, one that cannot report XID events at all is Healthy, unwatched
    nv, events = nvml
    nv.broken[f"nvmlDeviceRegisterEvents:{UUIDS[0]}"] = NVMLError_NotSupported("Not Supported")
    nv.broken[failing] = "Driver Not Loaded"
    live = LiveInventory(Inventory(_gpus(), 4))
    loop = NvmlHealthLoop(HealthTracker(live, frozenset(DEFAULT_IGNORED_XIDS)), first_retry_s=0.01)
    loop.start()
    try:
        _wait_for(live, lambda bad: set(bad) == set(UUIDS))
        del nv.broken[failing]
        _wait_for(live, lambda bad: not bad)
        events.put(EventData(nv.handles[1], XID_CRITICAL, 79))  # the other GPU is watched
        _wait_for(live, lambda bad: bad == {UUIDS[1]: "XID 79"})
        assert loop.problem() is None and loop.unwatched() == 0
    finally:
        loop.stop()
        assert loop.join(WAIT_S)
