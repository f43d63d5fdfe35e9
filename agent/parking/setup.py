"""Building the agent's `TurnPreparer` and its backend from its flags; the methods themselves
are listed in `agent.parking.methods`."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agent.core.residency import NullPreparer, TurnPreparer
from agent.parking.backends.app import CallTenant
from agent.parking.backends.base import Backend, BackendUnavailable
from agent.parking.host import ParkingHost
from agent.parking.methods import (
    METHODS,
    NONE,
    BuildInputs,
    default_headroom,
    parking_methods,
)
from agent.parking.preparer import ParkingPreparer
from baton.contract.meminfo import MEMINFO, mem_total_kib
from baton.contract.names import (
    DEFAULT_FAKE_GPU_DIR,
    DEFAULT_SLOTS_PER_GPU,
    MIB,
    fake_gpu_sizes,
    fake_gpu_uuid,
)

__all__ = [
    "ParkingOptions",
    "build_backend",
    "build_preparer",
    "half_the_ram",
    "nvml_gpus",
    "parse_fake_gpus",
]


@dataclass
class ParkingOptions:
    """The agent's flags about parking memory."""

    backend: str = NONE
    """The parking method (`agent.parking.methods`), or several separated by commas (the first
    is the node's default)."""
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
    """MiB kept free on each GPU; None = the most its methods want (`methods.default_headroom`)."""
    lock_timeout_s: float = 5.0
    callback_timeout_s: float = 60.0
    driver_call_timeout_s: float = 10.0
    """Seconds a cuda driver call may take beyond its lock timeout or copy time."""
    slowest_copy_gbps: float = 1.0
    """The slowest copy rate a checkpoint or restore deadline allows for (GB/s)."""
    simulated_inventory: bool = False
    """The app and endpoint methods take the simulated GPUs even where NVML sees real ones."""


def parse_fake_gpus(spec: str, node_name: str = "") -> dict[str, int]:
    """`2x81920` or `81920,40960` (MiB) to the node's simulated GPU UUIDs and their bytes."""
    return {fake_gpu_uuid(i, node_name): mib * MIB for i, mib in enumerate(fake_gpu_sizes(spec))}


def half_the_ram(meminfo: str = MEMINFO) -> int:
    """Half of the host's memory, in bytes."""
    return mem_total_kib(Path(meminfo).read_text()) * 1024 // 2


def build_backend(
    opts: ParkingOptions,
    call_tenant: CallTenant | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
) -> tuple[Backend, dict[str, int]]:
    """The backend the flags name and the GPU memory it manages, or `BackendUnavailable`.

    Several methods (`cuda,app`) make a `MultiBackend` over the GPUs of the first that measures
    its own (`agent.parking.methods`). The app backend reaches tenants through `call_tenant` (the
    agent's sessions) on `loop`.
    """
    methods = parking_methods(opts.backend)

    def simulated() -> dict[str, int]:
        return parse_fake_gpus(opts.fake_gpus, opts.node_name)

    def inventory() -> dict[str, int]:
        """The GPUs a method without its own driver manages: NVML's, else (or when asked)
        the simulated ones."""
        real = {} if opts.simulated_inventory else nvml_gpus()
        return real or simulated()

    inputs = BuildInputs(opts, call_tenant, loop, inventory=inventory, simulated=simulated)
    if len(methods) > 1:
        from agent.parking.multi import MultiBackend

        built = {m: _one_backend(m, inputs) for m in methods}
        measured = (g for m, (_, g) in built.items() if METHODS[m].measures_gpus)
        gpus = next(measured, built[methods[0]][1])
        return MultiBackend({m: b for m, (b, _) in built.items()}), gpus
    return _one_backend(methods[0], inputs)


def _one_backend(method: str, inputs: BuildInputs) -> tuple[Backend, dict[str, int]]:
    build = METHODS[method].build
    if build is None:
        raise BackendUnavailable(f"--backend {method} parks nothing: it has no backend")
    return build(inputs)


def nvml_gpus() -> dict[str, int]:
    """The GPUs NVML sees and their memory; empty without nvidia-ml-py or a driver."""
    try:
        import pynvml

        from agent.parking.backends.procs import gpu_memory

        pynvml.nvmlInit()
        return gpu_memory(pynvml)
    except Exception:  # NVMLError, ImportError: no GPUs to report
        return {}


def build_preparer(
    opts: ParkingOptions,
    host: ParkingHost | None = None,
    backend: tuple[Backend, Mapping[str, int]] | None = None,
) -> TurnPreparer:
    """The preparer for `baton agent`: `NullPreparer` for `none`, else a `ParkingPreparer` over
    `backend` (the backend and its GPU memory; built from the flags if not given) for `host`."""
    if opts.backend == NONE:
        return NullPreparer()
    parker, gpus = backend or build_backend(opts)
    budget = opts.host_memory_budget_mib * MIB
    if not budget:  # simulated GPUs only: room for a full GPU per slot
        fake_budget = DEFAULT_SLOTS_PER_GPU * sum(gpus.values())
        measured = [METHODS[m] for m in parking_methods(opts.backend) if METHODS[m].measures_gpus]
        simulated = bool(measured) and all(m.simulated for m in measured)
        budget = fake_budget if simulated else half_the_ram()
    return ParkingPreparer(
        parker, gpus, host_budget=budget, headroom=default_headroom(opts, gpus), host=host
    )
