"""llm-d's SnapshotAgentService over the real port: a WorkloadChannel workload is parked and
restored by Baton's app backend (on request and for another job's turn), with its data intact."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import cast

import grpc
import pytest

from agent.core import events as ev
from agent.parking.setup import ParkingOptions, parse_fake_gpus
from baton._pb import snapshot_agent_pb2 as sa
from baton._pb import snapshot_agent_pb2_grpc as sa_grpc
from baton._pb import timeslice_orchestrator_pb2 as ts
from baton.contract.names import MIB
from tests.agent.server.llmd.llmd_client import (
    SnapshotAgentClient,
    TimeSliceOrchestratorClient,
    WorkloadHandle,
    register_workload,
)
from tests.harness.agent import AgentRunner

GPU_MIB = 1024


class Workload:
    """An in-process engine: its "device" data goes to host memory on snapshot and comes back."""

    def __init__(self) -> None:
        self.device: bytes | None = bytes(range(256)) * 64
        self.host: bytes | None = None
        self.modes: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail = ""

    def on_snapshot(self, mode: int, tags: list[str]) -> None:
        assert self.gate.wait(10)
        if self.fail:
            raise RuntimeError(self.fail)
        self.modes.append(mode)
        self.host, self.device = self.device, None

    def on_restore(self, tags: list[str]) -> None:
        self.device, self.host = self.host, None


def llmd_agent(workdir: str, backend: str) -> AgentRunner:
    """An agent serving llm-d's API with one simulated GPU in group `g`, parking by `backend`."""
    gpu = next(iter(parse_fake_gpus(f"1x{GPU_MIB}")))
    return AgentRunner(
        workdir,
        parking=ParkingOptions(backend=backend, fake_gpus=f"1x{GPU_MIB}"),
        llmd_listen="127.0.0.1:0",
        llmd_groups=(f"g={gpu}",),
    ).start()


@pytest.fixture
def agent(workdir: str) -> Iterator[AgentRunner]:
    runner = llmd_agent(workdir, "app")
    yield runner
    runner.stop()


@pytest.fixture
def endpoint(agent: AgentRunner) -> str:
    return f"127.0.0.1:{agent.llmd_port}"


@pytest.fixture
def workload(endpoint: str) -> Iterator[tuple[Workload, WorkloadHandle]]:
    engine = Workload()
    handle = register_workload(
        endpoint,
        "engine",
        "g",
        engine.on_snapshot,
        engine.on_restore,
        supported_modes=[sa.SUSPEND_MODE_OFFLOAD, sa.SUSPEND_MODE_DISCARD],
        default_mode=sa.SUSPEND_MODE_OFFLOAD,
    )
    yield engine, handle
    engine.gate.set()
    handle.close()


def _registered(client: SnapshotAgentClient, job: str) -> None:
    """Wait until the agent lists the job (the channel's registration has arrived)."""
    for _ in range(500):
        if job in {j.job_id for j in client.status().job_statuses}:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"{job} never registered")


def _state(client: SnapshotAgentClient, job: str) -> str:
    states = {j.job_id: j.state for j in client.status().job_statuses}
    return sa.JobState.Name(states[job])


def test_snapshot_and_restore_through_the_workload_channel(
    endpoint: str, workload: tuple[Workload, WorkloadHandle]
) -> None:
    engine, _ = workload
    original = engine.device
    client = SnapshotAgentClient(endpoint)
    try:
        assert client.check_health() == "SERVING"
        assert client.check_health("app") == "SERVING"
        _registered(client, "engine")
        assert _state(client, "engine") == "JOB_STATE_RUNNING"
        config = sa.BackendConfig(app_channel=sa.AppChannelConfig(mode=sa.SUSPEND_MODE_DISCARD))
        op = client.wait_for_operation(client.snapshot("engine", "g", config), 0.01)
        assert sa.OperationStatus.Name(op.status) == "OPERATION_STATUS_COMPLETE", op.error
        assert op.HasField("storage_bytes") and not op.HasField("error")
        assert op.storage_bytes == op.snapshot_device_bytes == GPU_MIB * MIB
        assert engine.device is None and engine.host == original
        assert engine.modes == [sa.SUSPEND_MODE_DISCARD]
        assert _state(client, "engine") == "JOB_STATE_SAVED"
        gpu = client.status().accelerator_statuses[0]
        assert (gpu.memory_used_bytes, gpu.memory_total_bytes) == (0, GPU_MIB * MIB)
        op = client.wait_for_operation(client.restore("engine", "g"), 0.01)
        assert op.status == sa.OPERATION_STATUS_COMPLETE and op.storage_bytes == GPU_MIB * MIB
        assert engine.device == original, "the data came back as it was"
        assert _state(client, "engine") == "JOB_STATE_RUNNING"
    finally:
        client.close()


def test_another_jobs_turn_parks_the_workload_and_its_own_restores_it(
    endpoint: str, workload: tuple[Workload, WorkloadHandle]
) -> None:
    engine, _ = workload
    trainer_engine = Workload()
    trainer_channel = register_workload(
        endpoint, "trainer", "g", trainer_engine.on_snapshot, trainer_engine.on_restore
    )
    original = engine.device
    agent_client = SnapshotAgentClient(endpoint)
    trainer = TimeSliceOrchestratorClient(endpoint, "trainer", "g")
    sampler = TimeSliceOrchestratorClient(endpoint, "engine", "g")
    try:
        _registered(agent_client, "engine")
        _registered(agent_client, "trainer")
        assert trainer.acquire(timeout_sec=10)[0]
        assert engine.device is None and engine.host == original, "parked for the trainer"
        assert trainer_engine.device is not None, "only one job fits: the other one was parked"
        assert trainer.release() == (True, 0, True)
        ok, _, restored = sampler.acquire(timeout_sec=10)
        assert ok and restored, "its context came back for its turn"
        assert engine.device == original and trainer_engine.device is None
        status = sampler.get_status()
        assert status.group.group_state == ts.GroupStatus.STATE_LOCKED
        assert status.group.loaded_job == "engine"
        states = {s.job_id: s.job_state for s in status.agent_job_states}
        assert states == {
            "engine": ts.SnapshotAgentJobState.STATE_RUNNING,
            "trainer": ts.SnapshotAgentJobState.STATE_SAVED,
        }
    finally:
        for c in (agent_client, trainer, sampler):
            c.close()
        trainer_channel.close()


def test_every_status_code_the_reference_names(
    endpoint: str, workload: tuple[Workload, WorkloadHandle]
) -> None:
    engine, _ = workload
    client = SnapshotAgentClient(endpoint)
    try:
        _registered(client, "engine")
        endpoint_cfg = sa.BackendConfig(direct_memory=sa.DirectMemoryBackendConfig())
        cases = [
            (lambda: client.snapshot("nobody", "g"), grpc.StatusCode.NOT_FOUND),
            (lambda: client.snapshot("engine", "g", endpoint_cfg), grpc.StatusCode.UNIMPLEMENTED),
            (lambda: client.get_operation("op-unknown"), grpc.StatusCode.NOT_FOUND),
            (lambda: client.restore("engine", "g"), grpc.StatusCode.FAILED_PRECONDITION),
            (lambda: client.check_health("no.such.Service"), grpc.StatusCode.NOT_FOUND),
        ]
        for call, code in cases:
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == code, err.value.details()
        engine.gate.clear()
        first = client.snapshot("engine", "g")
        assert client.get_operation(first).status == sa.OPERATION_STATUS_PENDING
        with pytest.raises(grpc.RpcError) as busy:
            client.snapshot("engine", "g")
        assert busy.value.code() == grpc.StatusCode.ABORTED
        engine.gate.set()
        assert client.wait_for_operation(first, 0.01).status == sa.OPERATION_STATUS_COMPLETE
        with pytest.raises(grpc.RpcError) as saved:
            client.snapshot("engine", "g")
        assert saved.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        client.wait_for_operation(client.restore("engine", "g"), 0.01)
        engine.fail = "out of host memory"
        op = client.wait_for_operation(client.snapshot("engine", "g"), 0.01)
        assert op.status == sa.OPERATION_STATUS_FAILED and "out of host memory" in op.error
        assert not op.HasField("storage_bytes")
    finally:
        client.close()


def test_snapshot_and_restore_without_a_group_as_llm_ds_client_sends_them(
    endpoint: str, workload: tuple[Workload, WorkloadHandle]
) -> None:
    engine, _ = workload
    original = engine.device
    client = SnapshotAgentClient(endpoint)  # their snapshot(job_id, group="", ...)
    try:
        _registered(client, "engine")
        op = client.wait_for_operation(client.snapshot("engine"), 0.01)
        assert op.status == sa.OPERATION_STATUS_COMPLETE, op.error
        assert engine.device is None and engine.host == original
        op = client.wait_for_operation(client.restore("engine"), 0.01)
        assert op.status == sa.OPERATION_STATUS_COMPLETE, op.error
        assert engine.device == original
        with pytest.raises(grpc.RpcError) as unknown:
            client.snapshot("nobody")
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        assert unknown.value.details() == "no job 'nobody' on this node"
    finally:
        client.close()


def test_a_channel_must_open_with_one_registration(endpoint: str) -> None:
    channel = grpc.insecure_channel(endpoint)
    stub = sa_grpc.SnapshotAgentServiceStub(channel)
    try:
        result = sa.WorkloadMessage(result=sa.CommandResult(command_id="1", ok=True))
        with pytest.raises(grpc.RpcError) as err:
            list(stub.WorkloadChannel(iter([result]), timeout=5))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        caps = sa.WorkloadCapabilities()
        reg = sa.WorkloadMessage(
            register=sa.RegisterWorkload(job_id="x", group="g", capabilities=caps)
        )
        with pytest.raises(grpc.RpcError) as twice:
            list(stub.WorkloadChannel(iter([reg, reg]), timeout=5))
        assert twice.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        channel.close()


def test_a_workload_registering_without_a_group_as_llm_ds_client_does_joins_its_known_job(
    agent: AgentRunner, endpoint: str
) -> None:
    engine = Workload()
    early = register_workload(endpoint, "engine")  # their register_workload(agent, job_id)
    orchestrator = TimeSliceOrchestratorClient(endpoint, "engine", "g")
    client = SnapshotAgentClient(endpoint)
    handle: WorkloadHandle | None = None
    try:
        assert early.ended(5), "the refused registration's stream never ended"
        assert early.error is not None and early.error.code() == grpc.StatusCode.NOT_FOUND
        assert early.error.details() == (
            "no job 'engine' on this node: name its group (groups: g), "
            "or register after the job has acquired one"
        )
        assert orchestrator.acquire()[0] is True
        mark = agent.mark()
        handle = register_workload(endpoint, "engine", "", engine.on_snapshot, engine.on_restore)
        agent.wait_event(
            lambda e: (e.kind, e.tenant_id) == (ev.CONNECTED, "llmd/engine"), since=mark
        )
        assert orchestrator.release()[0] is True
        config = sa.BackendConfig(app_channel=sa.AppChannelConfig())
        op = client.wait_for_operation(client.snapshot("engine", "", config), 0.01)
        assert op.status == sa.OPERATION_STATUS_COMPLETE, op.error
        assert engine.device is None and [c.WhichOneof("command") for c in handle.commands] == [
            "snapshot"
        ]
    finally:
        for opened in (early, handle):
            if opened is not None:
                opened.close()
        orchestrator.close()
        client.close()


def test_a_registration_refused_for_its_default_mode_leaves_no_job_behind(
    agent: AgentRunner, endpoint: str
) -> None:
    """It was refused after the job had been joined: the refused registration left the
    `llmd/engine` tenant on the node, its caller counted as one of its processes."""
    no_such_mode = cast(sa.SuspendMode, 7)
    refused = register_workload(endpoint, "engine", "g", default_mode=no_such_mode)
    try:
        assert refused.ended(5), "the refused registration's stream never ended"
        assert refused.error is not None
        assert refused.error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "default_mode must be SUSPEND_MODE_OFFLOAD or SUSPEND_MODE_DISCARD" in (
            refused.error.details() or ""
        )
        assert "llmd/engine" not in agent.status()["tenants"]
    finally:
        refused.close()


def test_a_workload_that_registers_again_while_parked_is_sent_its_restore(
    agent: AgentRunner, endpoint: str, workload: tuple[Workload, WorkloadHandle]
) -> None:
    """llm-d's `register_workload` reconnects and registers again after a dropped stream; the
    new stream's session took the job for resident and answered the restore itself, so the
    workload never heard it and Baton reported RUNNING an engine still asleep."""
    engine, first = workload
    original = engine.device
    client = SnapshotAgentClient(endpoint)
    again: WorkloadHandle | None = None
    try:
        _registered(client, "engine")
        op = client.wait_for_operation(client.snapshot("engine", "g"), 0.01)
        assert op.status == sa.OPERATION_STATUS_COMPLETE, op.error
        assert engine.device is None
        mark = agent.mark()
        again = register_workload(endpoint, "engine", "g", engine.on_snapshot, engine.on_restore)
        agent.wait_event(
            lambda e: (e.kind, e.tenant_id) == (ev.CONNECTED, "llmd/engine"), since=mark
        )
        assert first.ended(5), "the new registration did not replace the old stream"
        assert _state(client, "engine") == "JOB_STATE_SAVED"
        op = client.wait_for_operation(client.restore("engine", "g"), 0.01)
        assert op.status == sa.OPERATION_STATUS_COMPLETE, op.error
        assert [c.WhichOneof("command") for c in again.commands] == ["restore"]
        assert engine.device == original, "the workload restored its memory"
    finally:
        if again is not None:
            again.close()
        client.close()


@contextlib.contextmanager
def _jobs_a_and_b(
    endpoint: str,
) -> Iterator[tuple[Workload, Workload, SnapshotAgentClient, TimeSliceOrchestratorClient]]:
    """Jobs `a` and `b` of group `g`, each with its workload's channel registered; a snapshot
    client, and `a`'s orchestrator client."""
    a_engine, b_engine = Workload(), Workload()
    channels = [
        register_workload(endpoint, job, "g", engine.on_snapshot, engine.on_restore)
        for job, engine in (("a", a_engine), ("b", b_engine))
    ]
    client = SnapshotAgentClient(endpoint)
    holder = TimeSliceOrchestratorClient(endpoint, "a", "g")
    try:
        _registered(client, "a")
        _registered(client, "b")
        yield a_engine, b_engine, client, holder
    finally:
        client.close()
        holder.close()
        for channel in channels:
            channel.close()


def test_a_holder_snapshotted_and_restored_in_its_turn_stays_resident_through_it(
    endpoint: str,
) -> None:
    """A Snapshot of the holder took it off the preparer's holders and its Restore did not put
    it back: another job's Restore then parked it in the middle of its turn."""
    with _jobs_a_and_b(endpoint) as (a_engine, b_engine, client, holder):
        assert holder.acquire(timeout_sec=10)[0] and b_engine.device is None
        refused = client.wait_for_operation(client.restore("b", "g"), 0.01)
        assert refused.status == sa.OPERATION_STATUS_FAILED, "a holds the GPU"
        for move in (client.snapshot, client.restore):
            op = client.wait_for_operation(move("a", "g"), 0.01)
            assert op.status == sa.OPERATION_STATUS_COMPLETE, op.error
        assert a_engine.device is not None
        op = client.wait_for_operation(client.restore("b", "g"), 0.01)
        assert op.status == sa.OPERATION_STATUS_FAILED, "a still holds the GPU"
        assert "holds a turn" in op.error
        assert a_engine.device is not None and _state(client, "a") == "JOB_STATE_RUNNING"


def test_the_holders_acquire_after_a_snapshot_in_its_turn_restores_it(endpoint: str) -> None:
    """llm-d's Acquire returns with the job's context loaded; the holder's answered at once,
    its memory still parked and another job's restored over it on the GPU it holds."""
    with _jobs_a_and_b(endpoint) as (a_engine, b_engine, client, holder):
        assert holder.acquire(timeout_sec=10)[0]
        for move, job in ((client.snapshot, "a"), (client.restore, "b")):
            op = client.wait_for_operation(move(job, "g"), 0.01)
            assert op.status == sa.OPERATION_STATUS_COMPLETE, op.error
        assert a_engine.device is None and b_engine.device is not None
        assert holder.acquire(timeout_sec=10) == (True, 0, True), "its context came back"
        assert a_engine.device is not None and b_engine.device is None
        assert _state(client, "a") == "JOB_STATE_RUNNING"
        op = client.wait_for_operation(client.restore("b", "g"), 0.01)
        assert op.status == sa.OPERATION_STATUS_FAILED, "a holds the GPU, resident"
