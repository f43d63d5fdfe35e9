"""Building the agent's `TurnPreparer` from its flags, and connecting it to the lease service."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent.core.residency import NullPreparer, TurnPreparer
from agent.parking.backends.base import Backend, BackendUnavailable, TenantRef
from agent.parking.metrics import Forward
from agent.parking.preparer import ParkingPreparer
from baton.contract.meminfo import MEMINFO, mem_total_kib
from baton.contract.names import (
    DEFAULT_FAKE_GPU_DIR,
    DEFAULT_SLOTS_PER_GPU,
    MIB,
    fake_gpu_sizes,
    fake_gpu_uuid,
)

if TYPE_CHECKING:
    from agent.node.tenants import Tenant
    from agent.server.service import LeaseService

BACKENDS = ("none", "fake", "cuda", "app")


@dataclass
class ParkingOptions:
    """The agent's flags about parking memory."""

    backend: str = "none"
    fake_gpus: str = "2x81920"
    """Simulated GPUs: `COUNTxMIB`, or MiB per GPU separated by commas."""
    node_name: str = ""
    """Names the simulated GPUs (`baton.contract.names.fake_gpu_uuid`); empty on a local machine."""
    fake_scale: float = 1 / 1024
    """Real bytes per simulated byte (fake backend)."""
    fake_dir: str = DEFAULT_FAKE_GPU_DIR
    pcie_gbps: float = 0.0
    """Modelled host-device bandwidth in GB/s (fake backend; 0 = copy as fast as memory)."""
    host_memory_budget_mib: int = 0
    """Host DRAM for parked memory; 0 = room for a full GPU per slot (fake) or half the RAM."""
    headroom_mib: int | None = None
    """MiB kept free on each GPU; None = the backend's default (cuda: 1024, others: 0)."""
    lock_timeout_s: float = 5.0
    callback_timeout_s: float = 60.0


def parse_fake_gpus(spec: str, node_name: str = "") -> dict[str, int]:
    """`2x81920` or `81920,40960` (MiB) to the node's simulated GPU UUIDs and their bytes."""
    return {fake_gpu_uuid(i, node_name): mib * MIB for i, mib in enumerate(fake_gpu_sizes(spec))}


def half_the_ram(meminfo: str = MEMINFO) -> int:
    """Half of the host's memory, in bytes."""
    return mem_total_kib(Path(meminfo).read_text()) * 1024 // 2


def build_backend(opts: ParkingOptions) -> tuple[Backend, dict[str, int]]:
    """The backend the flags name and the GPU memory it manages, or `BackendUnavailable`."""
    if opts.backend == "fake":
        from agent.parking.backends.fake import FakeBackend

        gpus = parse_fake_gpus(opts.fake_gpus, opts.node_name)
        pcie = opts.pcie_gbps or None
        return FakeBackend(opts.fake_dir, gpus, opts.fake_scale, pcie, opts.lock_timeout_s), gpus
    if opts.backend == "cuda":
        from agent.parking.backends.cuda import CudaBackend

        cuda = CudaBackend(
            lock_timeout_ms=int(opts.lock_timeout_s * 1000),
            headroom_bytes=default_headroom(opts),
        )
        return cuda, cuda.gpu_memory()
    if opts.backend == "app":
        from agent.parking.backends.app import AppBackend

        gpus = nvml_gpus() or parse_fake_gpus(opts.fake_gpus, opts.node_name)
        return AppBackend(opts.callback_timeout_s), gpus
    raise BackendUnavailable(f"unknown backend {opts.backend!r}; choose one of {BACKENDS}")


def nvml_gpus() -> dict[str, int]:
    """The GPUs NVML sees and their memory; empty without nvidia-ml-py or a driver."""
    try:
        import pynvml

        from agent.parking.backends.procs import gpu_memory

        pynvml.nvmlInit()
        return gpu_memory(pynvml)
    except Exception:  # NVMLError, ImportError: no GPUs to report
        return {}


def default_headroom(opts: ParkingOptions) -> int:
    """Bytes kept free on each GPU: the flag's, else the backend's default."""
    if opts.headroom_mib is not None:
        return opts.headroom_mib * MIB
    if opts.backend == "cuda":
        from agent.parking.backends.cuda import DEFAULT_HEADROOM

        return DEFAULT_HEADROOM
    return 0


def build_preparer(opts: ParkingOptions) -> TurnPreparer:
    """The preparer for `baton agent`: `NullPreparer` for `none`, else a `ParkingPreparer`."""
    if opts.backend == "none":
        return NullPreparer()
    backend, gpus = build_backend(opts)
    budget = opts.host_memory_budget_mib * MIB
    if not budget:
        fake_budget = DEFAULT_SLOTS_PER_GPU * sum(gpus.values())
        budget = fake_budget if opts.backend == "fake" else half_the_ram()
    return ParkingPreparer(backend, gpus, host_budget=budget, headroom=default_headroom(opts))


def tenant_ref(tenant: Tenant) -> TenantRef:
    """What a backend needs to know of one of the lease service's tenants."""
    return TenantRef(
        tenant.tenant_id,
        tuple(tenant.gpus),
        pids=tuple(sorted(tenant.pids)),
        memory_limit_bytes=tenant.memory_limit_bytes or None,
        pod_uid=tenant.pod_uid,
        declared_bytes=tenant.gpu_memory_mib * MIB or None,
    )


def connect_preparer(preparer: TurnPreparer, service: LeaseService) -> None:
    """Let the preparer read the service's tenants, reach their sessions and show its metrics."""
    if not isinstance(preparer, ParkingPreparer):
        return
    preparer.directory = lambda: {
        t.tenant_id: tenant_ref(t) for t in list(service.tenants.tenants.values())
    }
    preparer.quarantines.on_quarantine = service.quarantine
    preparer.on_change = service.persist
    service.metrics.registry.register(Forward(preparer.metrics.registry))
    from agent.parking.backends.app import AppBackend

    if isinstance(preparer.backend, AppBackend):
        preparer.backend.bind(service.sessions.call_tenant, asyncio.get_running_loop())
