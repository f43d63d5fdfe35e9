"""The cuda backend under the lease service: an agent restarted while a pod tenant is parked
(the state file says which processes, the driver confirms them, the next turn restores it), and
a quarantined tenant's turn (refused with the reason, an event)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from agent.core import events as ev
from agent.core.errors import Quarantined
from agent.core.leases import LeaseTable
from agent.node.state import StateDirError, StateStore
from agent.node.tenants import POD, Tenant
from agent.parking.backends.cuda import CudaBackend
from agent.parking.preparer import ParkingPreparer
from agent.server.service import LeaseService

from .standin_cuda import CHECKPOINTED, RUNNING, CUresult, StandInDriver, StandInNvml
from .test_cuda_backend import GIB, GPU
from .test_cuda_pods import SYSTEMD, spawn, v2

UIDS = {"a": "0f1e2d3c-aaaa-bbbb-cccc-123456789abc", "b": "1f1e2d3c-aaaa-bbbb-cccc-123456789abc"}
PIDS = {"a": 11, "b": 21}


def agent(state_dir: Path, proc: Path, driver: StandInDriver, nvml: StandInNvml) -> LeaseService:
    """A lease service with a parking preparer over the cuda backend, as `baton agent` wires it."""
    backend = CudaBackend(driver, nvml, proc_root=str(proc), cgroup_root=str(proc / "none"))
    return LeaseService(
        table=LeaseTable(clock=time.time),
        preparer=lambda host: ParkingPreparer(
            backend, {GPU: 10 * GIB}, host_budget=20 * GIB, headroom=GIB, host=host
        ),
        clock=time.time,
        store=StateStore(state_dir),
        reconnect_grace=600,
    )


def pod(name: str) -> Tenant:
    return Tenant(f"default/{name}", name, (GPU,), source=POD, pod_uid=UIDS[name])


def test_an_agent_restarted_while_a_tenant_is_parked_restores_it_first(tmp_path):
    proc = tmp_path / "proc"
    for name, pid in PIDS.items():
        spawn(proc, pid, v2(SYSTEMD, UIDS[name], "trainer"))
    driver = StandInDriver(states={11: RUNNING, 21: RUNNING})
    nvml = StandInNvml(driver, {GPU: 10 * GIB})
    nvml.used[GPU] = {11: 5 * GIB, 21: 5 * GIB}

    async def before() -> None:
        service = agent(tmp_path / "state", proc, driver, nvml)
        service.load()
        for name in PIDS:
            service.upsert_pod(pod(name))
        await service.preparer.prepare("default/a", [GPU])
        await service.preparer.prepare("default/b", [GPU])  # parks a
        await service.close()

    asyncio.run(asyncio.wait_for(before(), 10))
    assert driver.states[11] == CHECKPOINTED
    saved = json.loads((tmp_path / "state" / "agent-state.json").read_text())
    assert saved["parked"]["default/a"]["pids"] == {"11": {GPU: 5 * GIB}}

    async def after() -> dict:
        service = agent(tmp_path / "state", proc, driver, nvml)
        service.load()
        await service.preparer.refresh()  # type: ignore[attr-defined]
        status = service.preparer.status()
        await service.preparer.prepare("default/a", [GPU])
        await service.close()
        return status

    status = asyncio.run(asyncio.wait_for(after(), 10))
    assert status["tenants"]["default/a"]["residency"] == "parked"
    assert status["tenants"]["default/a"]["parked_bytes"] == 5 * GIB
    assert driver.states[11] == RUNNING and driver.states[21] == CHECKPOINTED
    saved = json.loads((tmp_path / "state" / "agent-state.json").read_text())
    assert list(saved["parked"]) == ["default/b"]


def test_a_quarantined_tenant_is_refused_its_turn_with_the_reason_and_an_event(tmp_path):
    proc = tmp_path / "proc"
    for name, pid in PIDS.items():
        spawn(proc, pid, v2(SYSTEMD, UIDS[name], "trainer"))
    driver = StandInDriver(states={11: RUNNING, 21: RUNNING})
    nvml = StandInNvml(driver, {GPU: 10 * GIB})
    nvml.used[GPU] = {11: 5 * GIB, 21: 5 * GIB}

    async def run() -> list[ev.Event]:
        service = agent(tmp_path / "state", proc, driver, nvml)
        events = service.events.attach()
        for name in PIDS:
            service.upsert_pod(pod(name))
        a, b = (service.tenants.tenants[f"default/{n}"] for n in PIDS)
        for tenant in (a, b):  # b's turn parks a
            granted = await service.acquire(tenant, [], timeout=5)
            service.yield_(tenant, granted.lease.lease_id)
        driver.fail[("restore", 11)] = CUresult.CUDA_ERROR_OUT_OF_MEMORY
        with pytest.raises(Quarantined, match="out of device memory"):
            await service.acquire(a, [], timeout=5)
        with pytest.raises(Quarantined):
            await service.acquire(a, [], timeout=5)
        status = service.preparer.status()["tenants"]["default/a"]
        assert status["residency"] == "quarantined"
        await service.close()
        return [events.get_nowait() for _ in range(events.qsize())]

    seen = asyncio.run(asyncio.wait_for(run(), 10))
    quarantined = [e for e in seen if e.kind == ev.QUARANTINED]
    assert len(quarantined) == 1 and quarantined[0].tenant_id == "default/a"
    assert "out of device memory" in quarantined[0].detail


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ({"default/a": []}, "tenant 'default/a': not an object with a 'pids' object"),
        ({"default/a": {}}, "tenant 'default/a': not an object with a 'pids' object"),
        ({"default/a": {"pids": {"eleven": {GPU: GIB}}}}, "pid 'eleven' is not a process ID"),
        ({"default/a": {"pids": {"-11": {GPU: GIB}}}}, "pid '-11' is not a process ID"),
        ({"default/a": {"pids": {"11": [GIB]}}}, "pid 11: not an object of bytes per GPU"),
        ({"default/a": {"pids": {"11": {GPU: "5G"}}}}, f"bytes on {GPU} are '5G', not a count"),
        ({"default/a": {"pids": {"11": {GPU: True}}}}, f"bytes on {GPU} are True, not a count"),
        ({"default/a": {"pids": {}, "quarantined": 1}}, "'quarantined' is 1, not a reason"),
        ({"methods": {"cuda": ["default/a"]}}, "the cuda record is a JSON list, not an object"),
    ],
)
@pytest.mark.parametrize("where", ["snapshot", "journal"])
def test_a_parked_record_of_another_shape_stops_the_agent_in_one_line_naming_it(
    tmp_path, record, why, where
):
    """The record of parked processes read back at start: a damaged one names its file (and
    journal line) and the field, instead of a traceback out of the backend."""
    store = StateStore(tmp_path / "state")
    if where == "snapshot":
        (tmp_path / "state" / "agent-state.json").write_text(json.dumps({"parked": record}))
        named = "agent-state.json"
    else:
        store.record_parked({"default/b": {"pids": {"21": {GPU: GIB}}}})
        store.record_parked(record)
        named = "agent-journal.jsonl line 2"
    driver = StandInDriver(states={21: CHECKPOINTED})
    service = agent(tmp_path / "state", tmp_path / "proc", driver, StandInNvml(driver, {}))
    with pytest.raises(StateDirError) as raised:
        service.load()
    message = str(raised.value)
    assert f"{named}: its record of parked memory is not one this agent wrote" in message
    assert why in message and "\n" not in message
    assert "move it aside to start afresh, forgetting what it holds parked" in message
