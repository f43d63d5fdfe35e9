"""A driver-parked pod (the cuda backend over its stand-in) and a self-offloading pod (the app
method, asked for by its `baton.dev/parking` annotation) take turns on one GPU too small for
both: each grant parks the other by its own method first, so every restore finds its room."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from agent.core.leases import LeaseTable
from agent.node.tenants import POD, Tenant
from agent.parking.backends.app import AppBackend
from agent.parking.backends.cuda import CudaBackend
from agent.parking.multi import MultiBackend
from agent.parking.preparer import ParkingPreparer
from agent.server.service import LeaseService
from agent.server.sessions import Session

from .standin_cuda import CHECKPOINTED, RUNNING, StandInDriver, StandInNvml
from .test_cuda_backend import GIB, GPU
from .test_cuda_pods import SYSTEMD, spawn, v2

UIDS = {
    "driver": "0f1e2d3c-aaaa-bbbb-cccc-123456789abc",
    "self": "1f1e2d3c-aaaa-bbbb-cccc-123456789abc",
}
PIDS = {"driver": 11, "self": 21}


class SelfOffloading:
    """The app pod's callbacks: its 6 GiB leave the GPU on park and need free room on restore."""

    def __init__(self, nvml: StandInNvml) -> None:
        self.nvml = nvml
        self.calls: list[str] = []

    async def __call__(self, tenant_id: str, action: str, gpu: str, timeout: float) -> int:
        self.calls.append(action)
        if action == "park":
            self.nvml.used[gpu].pop(PIDS["self"], None)
        else:
            assert self.nvml.free(gpu) >= 6 * GIB, "restored before its room was made"
            self.nvml.used[gpu][PIDS["self"]] = 6 * GIB
        return 6 * GIB


def test_a_driver_parked_pod_and_a_self_offloading_pod_share_one_gpu(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for name, pid in PIDS.items():
        spawn(proc, pid, v2(SYSTEMD, UIDS[name], "trainer"))
    driver = StandInDriver(states={PIDS["driver"]: RUNNING})
    nvml = StandInNvml(driver, {GPU: 10 * GIB})
    nvml.used[GPU] = {PIDS["driver"]: 6 * GIB, PIDS["self"]: 6 * GIB}
    app = SelfOffloading(nvml)

    async def run() -> list[tuple[str, int, str]]:
        cuda = CudaBackend(driver, nvml, proc_root=str(proc), cgroup_root=str(proc / "none"))
        multi = MultiBackend(
            {"cuda": cuda, "app": AppBackend(5.0, app, asyncio.get_running_loop())}
        )
        service = LeaseService(
            table=LeaseTable(clock=time.time),
            preparer=lambda host: ParkingPreparer(
                multi, {GPU: 10 * GIB}, host_budget=20 * GIB, headroom=0, host=host
            ),
            clock=time.time,
        )
        service.upsert_pod(
            Tenant("default/driver", "driver", (GPU,), source=POD, pod_uid=UIDS["driver"])
        )
        service.upsert_pod(
            Tenant(
                "default/self", "self", (GPU,), gpu_memory_mib=6144, source=POD,
                pod_uid=UIDS["self"], parking="app",
            )
        )  # fmt: skip
        callbacks = frozenset({"park", "restore"})  # its session offers them (the app calls it)
        service.sessions.open(Session("default/self", PIDS["self"], "", callbacks))
        seen = []
        for name in ("driver", "self", "driver", "self", "driver"):
            tenant = service.tenants.tenants[f"default/{name}"]
            granted = await service.acquire(tenant, [], timeout=5)
            seen.append((name, driver.states[PIDS["driver"]], app.calls[-1] if app.calls else ""))
            service.yield_(tenant, granted.lease.lease_id)
        methods = {t: e["method"] for t, e in service.preparer.status()["tenants"].items()}
        assert methods == {"default/driver": "cuda", "default/self": "app"}
        await service.close()
        return seen

    seen = asyncio.run(asyncio.wait_for(run(), 20))
    assert seen == [
        ("driver", RUNNING, "park"),  # both were resident: it offloaded itself
        ("self", CHECKPOINTED, "restore"),  # the driver's checkpoint made its room first
        ("driver", RUNNING, "park"),  # it offloaded itself, then the driver restored
        ("self", CHECKPOINTED, "restore"),
        ("driver", RUNNING, "park"),
    ]
    assert app.calls == ["park", "restore", "park", "restore", "park"]
