"""Pod tenants on the cuda backend: processes found from the pod's cgroup, memory cgroup limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.core.planner import TenantView
from agent.parking.backends import procs
from agent.parking.backends.base import Residency, TenantRef
from agent.parking.backends.cuda import CudaBackend

from .standin_cuda import CHECKPOINTED, LOCKED, RUNNING, StandInDriver, StandInNvml
from .test_cuda_backend import GIB, GPU, moves

UID = "0f1e2d3c-aaaa-bbbb-cccc-123456789abc"
OTHER = "99999999-aaaa-bbbb-cccc-123456789abc"
SYSTEMD = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/cri-{c}.scope"
CGROUPFS = "/kubepods/besteffort/pod{u}/{c}"


def spawn(proc: Path, pid: int, text: str) -> None:
    """A fake /proc/<pid>/cgroup."""
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cgroup").write_text(text)


def v2(layout: str, uid: str, container: str) -> str:
    u = uid.replace("-", "_") if layout is SYSTEMD else uid
    return f"0::{layout.format(u=u, c=container)}\n"


def v1(uid: str, container: str) -> str:
    path = CGROUPFS.format(u=uid, c=container)
    return f"12:memory:{path}\n11:cpu,cpuacct:{path}\n1:name=systemd:{path}\n"


@pytest.fixture
def proc(tmp_path):
    return tmp_path / "proc"


def backend_for(proc: Path, driver: StandInDriver, cgroups: Path | None = None) -> CudaBackend:
    nvml = StandInNvml(driver, {GPU: 80 * GIB})
    nvml.used[GPU] = {pid: GIB for pid in driver.states}
    root = str(cgroups) if cgroups else str(proc.parent / "cg")
    return CudaBackend(driver, nvml, proc_root=str(proc), cgroup_root=root)


@pytest.mark.parametrize("layout", ["systemd-v2", "cgroupfs-v2", "cgroupfs-v1"])
def test_every_process_of_every_container_with_cuda_state_is_found(proc, layout):
    def line(uid: str, container: str) -> str:
        if layout == "cgroupfs-v1":
            return v1(uid, container)
        return v2(SYSTEMD if layout == "systemd-v2" else CGROUPFS, uid, container)

    spawn(proc, 10, line(UID, "pause"))  # the pause container: no CUDA state
    spawn(proc, 11, line(UID, "trainer"))
    spawn(proc, 12, line(UID, "trainer"))  # a dataloader worker without a context
    spawn(proc, 13, line(UID, "sidecar"))
    spawn(proc, 20, line(OTHER, "trainer"))
    driver = StandInDriver(states={11: RUNNING, 13: RUNNING, 20: RUNNING}, no_context={12})
    backend = backend_for(proc, driver)
    backend.attach(TenantRef("pod", (GPU,), pod_uid=UID))
    assert backend.pids("pod") == (11, 13)
    assert backend.footprint("pod", GPU) == 2 * GIB
    assert backend.park("pod", GPU).bytes == 2 * GIB
    assert driver.states[11] == driver.states[13] == CHECKPOINTED and driver.states[20] == RUNNING


def test_processes_are_found_again_before_each_park_and_when_a_session_opens(proc):
    spawn(proc, 11, v2(SYSTEMD, UID, "trainer"))
    driver = StandInDriver(states={11: RUNNING, 14: RUNNING})
    backend = backend_for(proc, driver)
    backend.attach(TenantRef("pod", (GPU,), pod_uid=UID))
    assert backend.pids("pod") == (11,)
    spawn(proc, 14, v2(SYSTEMD, UID, "trainer"))  # a new process of the pod
    backend.park("pod", GPU)
    assert ("checkpoint", 14) in moves(driver)
    backend.restore("pod", GPU)
    spawn(proc, 15, v2(SYSTEMD, UID, "trainer"))
    driver.states[15] = RUNNING
    backend.rescan("pod")
    assert backend.pids("pod") == (11, 14, 15)


def test_the_memory_cgroup_with_the_least_room_is_reported_v2(proc, tmp_path):
    path = SYSTEMD.format(u=UID.replace("-", "_"), c="x")
    spawn(proc, 11, f"0::{path}\n")
    leaf = tmp_path / "cg" / path.lstrip("/")
    leaf.mkdir(parents=True)
    (leaf / "memory.max").write_text("max\n")
    (leaf.parent / "memory.max").write_text(f"{8 * GIB}\n")
    (leaf.parent / "memory.current").write_text(f"{5 * GIB}\n")
    (leaf.parent.parent / "memory.max").write_text(f"{16 * GIB}\n")
    (leaf.parent.parent / "memory.current").write_text(f"{6 * GIB}\n")
    driver = StandInDriver(states={11: RUNNING})
    backend = backend_for(proc, driver)
    backend.attach(TenantRef("pod", (GPU,), pod_uid=UID))
    assert (backend.memory_limit("pod"), backend.memory_used("pod")) == (8 * GIB, 5 * GIB)


def test_the_memory_cgroup_is_read_on_cgroup_v1(proc, tmp_path):
    spawn(proc, 11, v1(UID, "x"))
    leaf = tmp_path / "cg" / "memory" / CGROUPFS.format(u=UID, c="x").lstrip("/")
    leaf.mkdir(parents=True)
    (leaf / "memory.limit_in_bytes").write_text(f"{(1 << 63) - 4096}\n")  # unlimited
    (leaf.parent / "memory.limit_in_bytes").write_text(f"{4 * GIB}\n")
    (leaf.parent / "memory.usage_in_bytes").write_text(f"{GIB}\n")
    assert procs.memory_cgroup(11, str(proc), str(tmp_path / "cg")) == procs.CgroupMemory(
        4 * GIB, GIB
    )


def test_the_cgroup_check_counts_what_the_cgroup_uses_already():
    fits = TenantView("t", footprint={GPU: 3 * GIB}, memory_limit=8 * GIB, memory_used=4 * GIB)
    tight = TenantView("t", footprint={GPU: 3 * GIB}, memory_limit=8 * GIB, memory_used=6 * GIB)
    assert not fits.cgroup_blocks_park()
    assert tight.cgroup_blocks_park()
    assert "on top of the 6144 MiB it uses" in tight.cgroup_message()


def test_a_thread_named_as_a_process_of_the_pod_is_moved_as_its_process(proc):
    """llm-d's Snapshot may name a thread of the pod's process; the driver takes a thread's ID
    for its process, so it must be locked once, not twice."""
    spawn(proc, 11, v2(SYSTEMD, UID, "engine"))
    (proc / "15").mkdir()  # a thread of 11: not listed in /proc, but /proc/15 resolves
    for pid in (11, 15):
        (proc / str(pid) / "status").write_text(f"Name:\tpython\nTgid:\t11\nPid:\t{pid}\n")
    driver = StandInDriver(states={11: RUNNING}, threads={15: 11})
    backend = backend_for(proc, driver)
    backend.attach(TenantRef("pod", (GPU,), pids=(15,), pod_uid=UID))
    assert backend.park("pod", GPU).bytes == GIB
    assert moves(driver) == [("lock", 11), ("checkpoint", 11)]
    assert backend.state("pod").pids == (11,)
    backend.restore("pod", GPU)
    assert driver.states[11] == RUNNING


def test_processes_the_driver_reports_parked_or_locked_are_taken_back_without_a_record(proc):
    spawn(proc, 11, v2(SYSTEMD, UID, "trainer"))
    spawn(proc, 12, v2(SYSTEMD, UID, "trainer"))
    driver = StandInDriver(states={11: CHECKPOINTED, 12: LOCKED})  # an agent died mid-park
    backend = backend_for(proc, driver)
    backend.attach(TenantRef("pod", (GPU,), pod_uid=UID, declared_bytes=3 * GIB))
    st = backend.state("pod")
    assert st.residency == {GPU: Residency.PARKED} and st.parked_bytes == 3 * GIB
    assert driver.states[12] == CHECKPOINTED  # the park is finished: none of it stays behind
    backend.restore("pod", GPU)
    assert driver.states[11] == driver.states[12] == RUNNING


def test_a_parked_tenant_whose_processes_live_on_is_kept_when_detached(proc):
    spawn(proc, 11, v2(SYSTEMD, UID, "trainer"))
    driver = StandInDriver(states={11: RUNNING})
    backend = backend_for(proc, driver)
    backend.attach(TenantRef("pod", (GPU,), pod_uid=UID))
    backend.park("pod", GPU)
    backend.detach("pod")  # e.g. dropped after an agent restart before it reconnected
    backend.attach(TenantRef("pod", (GPU,), pod_uid=UID))
    assert backend.state("pod").residency == {GPU: Residency.PARKED}
    backend.restore("pod", GPU)
    assert driver.states[11] == RUNNING
    backend.park("pod", GPU)
    (proc / "11" / "cgroup").unlink()
    (proc / "11").rmdir()  # the process is gone
    backend.detach("pod")
    assert backend.tenants() == []
