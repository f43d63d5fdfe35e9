"""A client of llm-d's time-slicing API written from its published behaviour, not from Baton.

It does what llm-d's `timeslice` package does, call for call: plaintext gRPC; `acquire` returns
(success, waited_ms, context_restored) and `release` (the Yield RPC) returns (success,
pending_waiters, snapshot_deferred); the snapshot-agent client returns operation ids and polls
GetOperation; `register_workload` keeps a WorkloadChannel open in a daemon thread and answers
each command with the callback's outcome.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from baton._pb import health_pb2 as hp
from baton._pb import health_pb2_grpc as hp_grpc
from baton._pb import snapshot_agent_pb2 as sa
from baton._pb import snapshot_agent_pb2_grpc as sa_grpc
from baton._pb import timeslice_orchestrator_pb2 as ts
from baton._pb import timeslice_orchestrator_pb2_grpc as ts_grpc


class TimeSliceOrchestratorClient:
    """`timeslice.TimeSliceOrchestratorClient`: acquire and release a group's lock."""

    def __init__(self, target: str, job_id: str | None = None, group_id: str | None = None):
        self.channel = grpc.insecure_channel(target)
        self.stub = ts_grpc.TimeSliceOrchestratorServiceStub(self.channel)
        self.job_id, self.group_id = job_id, group_id

    def acquire(
        self, job_id: str | None = None, group_id: str | None = None, timeout_sec: float = 600
    ) -> tuple[bool, int, bool]:
        r = self.stub.Acquire(
            ts.AcquireRequest(job_id=job_id or self.job_id, group_id=group_id or self.group_id),
            timeout=timeout_sec,
        )
        return r.success, r.waited_ms, r.context_restored

    def release(
        self, job_id: str | None = None, group_id: str | None = None, timeout_sec: float = 30
    ) -> tuple[bool, int, bool]:
        r = self.stub.Yield(
            ts.YieldRequest(job_id=job_id or self.job_id, group_id=group_id or self.group_id),
            timeout=timeout_sec,
        )
        return r.success, r.pending_waiters, r.snapshot_deferred

    def get_status(self, group_id: str | None = None) -> ts.GetGroupStatusResponse:
        request = ts.GetGroupStatusRequest(group_id=group_id or self.group_id)
        return self.stub.GetGroupStatus(request, timeout=10)

    def list_groups(self) -> list[str]:
        return list(self.stub.ListGroups(ts.ListGroupsRequest(), timeout=10).group_ids)

    def close(self) -> None:
        self.channel.close()


class SnapshotAgentClient:
    """`timeslice.SnapshotAgentClient`: operations, status and health."""

    def __init__(self, endpoint: str):
        self.channel = grpc.insecure_channel(endpoint)
        self.stub = sa_grpc.SnapshotAgentServiceStub(self.channel)
        self.health = hp_grpc.HealthStub(self.channel)

    def snapshot(self, job_id: str, group: str = "", backend_config: Any = None) -> str:
        request = sa.SnapshotRequest(job_id=job_id, group=group, backend_config=backend_config)
        return str(self.stub.Snapshot(request, timeout=10).operation_id)

    def restore(self, job_id: str, group: str = "", backend_config: Any = None) -> str:
        request = sa.RestoreRequest(job_id=job_id, group=group, backend_config=backend_config)
        return str(self.stub.Restore(request, timeout=10).operation_id)

    def get_operation(self, op_id: str) -> sa.GetOperationResponse:
        return self.stub.GetOperation(sa.GetOperationRequest(operation_id=op_id), timeout=10)

    def wait_for_operation(
        self, op_id: str, poll_interval_sec: float = 1.0, limit_sec: float = 20
    ) -> sa.GetOperationResponse:
        """Poll GetOperation as their client does (bounded here)."""
        deadline = time.monotonic() + limit_sec
        while time.monotonic() < deadline:
            op = self.get_operation(op_id)
            if op.status != sa.OPERATION_STATUS_PENDING:
                return op
            time.sleep(poll_interval_sec)
        raise TimeoutError(f"operation {op_id} still pending after {limit_sec} s")

    def status(self) -> sa.StatusResponse:
        return self.stub.Status(sa.StatusRequest(), timeout=10)

    def check_health(self, service: str = "") -> str:
        r = self.health.Check(hp.HealthCheckRequest(service=service), timeout=10)
        return hp.HealthCheckResponse.ServingStatus.Name(r.status)

    def close(self) -> None:
        self.channel.close()


class WorkloadHandle:
    """`register_workload`'s handle: the channel thread and what it has seen."""

    def __init__(
        self,
        agent: str,
        register: sa.RegisterWorkload,
        on_snapshot: Callable[[int, list[str]], None],
        on_restore: Callable[[list[str]], None],
    ):
        self.channel = grpc.insecure_channel(agent)
        self._stub = sa_grpc.SnapshotAgentServiceStub(self.channel)
        self._register = register
        self._on_snapshot, self._on_restore = on_snapshot, on_restore
        self._outbox: queue.Queue[sa.WorkloadMessage | None] = queue.Queue()
        self.commands: list[sa.AgentCommand] = []
        self.error: grpc.RpcError | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _messages(self) -> Iterator[sa.WorkloadMessage]:
        yield sa.WorkloadMessage(register=self._register)
        while (message := self._outbox.get()) is not None:
            yield message

    def _run(self) -> None:
        try:
            for command in self._stub.WorkloadChannel(self._messages()):
                self.commands.append(command)
                result = sa.CommandResult(command_id=command.command_id, ok=True)
                try:
                    if command.WhichOneof("command") == "snapshot":
                        self._on_snapshot(command.snapshot.mode, list(command.snapshot.tags))
                    else:
                        self._on_restore(list(command.restore.tags))
                except Exception as e:
                    result.ok, result.error = False, str(e)
                self._outbox.put(sa.WorkloadMessage(result=result))
        except grpc.RpcError as e:
            self.error = e

    def ended(self, timeout: float) -> bool:
        """Whether the stream has ended (the agent refused or closed it) within `timeout`."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self, timeout: float = 5.0) -> None:
        self._outbox.put(None)
        self.channel.close()
        self._thread.join(timeout)


def register_workload(
    agent: str,
    job_id: str,
    group: str = "",
    on_snapshot: Callable[[int, list[str]], None] | None = None,
    on_restore: Callable[[list[str]], None] | None = None,
    supported_modes: list[sa.SuspendMode] | None = None,
    default_mode: sa.SuspendMode = sa.SUSPEND_MODE_UNSPECIFIED,
    tags: list[str] | None = None,
) -> WorkloadHandle:
    caps = sa.WorkloadCapabilities(
        supported_modes=supported_modes or [], default_mode=default_mode, tags=tags or []
    )
    register = sa.RegisterWorkload(job_id=job_id, group=group, capabilities=caps)
    return WorkloadHandle(
        agent, register, on_snapshot or (lambda m, t: None), on_restore or (lambda t: None)
    )
