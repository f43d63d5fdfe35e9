"""A fake node for the load and fault runs: the real agent, the fake backend, and a journal.

`LoadNode` is `tests.harness.agent.AgentRunner` with the fake backend, extended to note every
completed park and restore, and a reader of the agent's gRPC WatchEvents stream; both
feed an `InvariantChecker`.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from agent.parking.backends.base import Move
from agent.parking.backends.fake import FakeBackend
from agent.parking.preparer import ParkingPreparer
from agent.parking.setup import ParkingOptions, parse_fake_gpus
from agent.wire.handshake import watch_metadata
from baton._pb import agent_pb2 as pb
from baton._pb import agent_pb2_grpc
from baton.contract.names import ENV_AGENT_SOCKET, ENV_FAKE_GPU_DIR, ENV_GPUS
from tests.harness.agent import AgentRunner, short_tmpdir

from .checker import InvariantChecker


class JournalBackend(FakeBackend):
    """The fake backend, telling the checker about every completed move."""

    def __init__(self, checker: InvariantChecker, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.checker = checker
        self.journal_lock = threading.Lock()

    def park(self, tenant_id: str, gpu: str) -> Move:
        return self._noted("park", super().park, tenant_id, gpu)

    def restore(self, tenant_id: str, gpu: str) -> Move:
        return self._noted("restore", super().restore, tenant_id, gpu)

    def _noted(self, direction: str, fn: Any, tenant_id: str, gpu: str) -> Move:
        started = time.time()
        move: Move = fn(tenant_id, gpu)
        with self.journal_lock:
            self.checker.move(direction, tenant_id, gpu, started, time.time())
        return move


class LoadNode(AgentRunner):
    """An in-process agent on fake GPUs whose events and moves reach `self.checker`."""

    def __init__(
        self,
        fake_gpus: str,
        *,
        host_budget_mib: int = 0,
        scale: float = 1 / 64,
        **config: Any,
    ) -> None:
        workdir = short_tmpdir()
        fake_dir = f"{workdir}/gpus"
        checker = InvariantChecker()
        gpus = parse_fake_gpus(fake_gpus)
        backend = JournalBackend(checker, fake_dir, gpus, scale, None, 5.0)
        parking = ParkingOptions(
            backend="fake", fake_gpus=fake_gpus, fake_dir=fake_dir, fake_scale=scale,
            host_memory_budget_mib=host_budget_mib,
        )  # fmt: skip
        super().__init__(workdir, backend=(backend, gpus), parking=parking, **config)
        self.fake_dir = fake_dir
        self.checker = checker
        self.gpu_ids = sorted(gpus)
        self.journal = backend
        self._watch: grpc.Channel | None = None
        self.watching = threading.Event()

    @property
    def parking(self) -> ParkingPreparer:
        """The agent's parking preparer (once started)."""
        parking = self.agent.parking
        assert isinstance(parking, ParkingPreparer)
        return parking

    def start(self) -> LoadNode:
        """Start the agent, then the events reader."""
        super().start()
        self._watch = grpc.insecure_channel(f"unix:{self.socket}")
        threading.Thread(target=self._read_events, daemon=True).start()
        if not self.watching.wait(10):
            raise AssertionError("the agent's WatchEvents stream did not open within 10 s")
        return self

    def _read_events(self) -> None:
        assert self._watch is not None
        metadata = watch_metadata(self.socket, self.config.state_dir)
        stream = agent_pb2_grpc.AgentStub(self._watch).WatchEvents(
            pb.WatchEventsRequest(), metadata=metadata
        )
        self.watching.set()
        try:
            for e in stream:
                with self.journal.journal_lock:
                    self.checker.event(
                        e.kind, e.tenant_id, e.at, gpus=e.gpus, lease_id=e.lease_id,
                        tokens=dict(e.fencing_tokens),
                    )  # fmt: skip
        except grpc.RpcError:
            return  # the agent stopped

    def tenant_env(self, gpu: str) -> dict[str, str]:
        """What a tenant process on `gpu` needs to find the agent and its memory."""
        return {ENV_AGENT_SOCKET: self.socket, ENV_GPUS: gpu, ENV_FAKE_GPU_DIR: self.fake_dir}

    def stop(self) -> None:
        """Stop the agent, the events reader and the backend; remove the work directory."""
        super().stop()
        if self._watch is not None:
            self._watch.close()
        self.journal.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def parked_bytes(self) -> int:
        """Simulated bytes parked in host memory now, as the agent's metric reports them."""
        value = self.parking.metrics.registry.get_sample_value("baton_parked_bytes")
        return int(value or 0)

    def tenant_dirs(self) -> list[Path]:
        """Tenant directories the fake backend still keeps."""
        root = Path(self.fake_dir) / "tenants"
        return sorted(root.iterdir()) if root.exists() else []
