"""The parking methods, in one table: each one's name, what it is, and how it is built.

`--backend`'s choices, the command line's help, the handoff bench's choices, the llm-d Snapshot
path's method names and the defaults that depend on the method (headroom, host budget) all read
`METHODS`. A new method is its backend module and one row here (see docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.parking.backends.base import BackendUnavailable
from baton.contract.names import FAKE_GPU_UUID_PREFIX, MIB

if TYPE_CHECKING:
    import asyncio

    from agent.parking.backends.app import CallTenant
    from agent.parking.backends.base import Backend
    from agent.parking.setup import ParkingOptions

NONE, FAKE, CUDA, APP, ENDPOINT = "none", "fake", "cuda", "app", "endpoint"
"""The methods' names, as `--backend`, `baton.dev/parking` and the backends' `name` spell them."""


@dataclass(frozen=True)
class BuildInputs:
    """What a method's builder is given: the agent's flags, its sessions and loop, the node."""

    opts: ParkingOptions
    call_tenant: CallTenant | None
    """How the agent reaches a tenant's callbacks over its session (the app method)."""
    loop: asyncio.AbstractEventLoop | None
    inventory: Callable[[], dict[str, int]]
    """The node's GPUs and their memory: NVML's, else (or when asked) the simulated ones."""
    simulated: Callable[[], dict[str, int]]
    """The simulated GPUs `--fake-gpus` names."""


Build = Callable[[BuildInputs], "tuple[Backend, dict[str, int]]"]
"""A method's backend and the GPU memory it manages; `BackendUnavailable` if it cannot run."""


@dataclass(frozen=True)
class ParkingMethod:
    """One way to move a tenant's memory off its GPUs and back."""

    name: str
    description: str
    """One line for the command line's help and the docs."""
    build: Build | None
    """None only for `none`, which parks nothing."""
    measures_gpus: bool = True
    """It has a driver of its own that tells the GPUs (`fake`, `cuda`); false: it takes the
    node's inventory (`app`, `endpoint`)."""
    simulated: bool = False
    """Its GPUs are files standing in for device memory (`fake`)."""
    self_parks: bool = False
    """The tenant parks itself, through its own callbacks (`app`)."""
    needs_target: bool = False
    """It parks a tenant only once llm-d's Snapshot names the tenant's engine (`endpoint`): no
    plain tenant (the handoff bench's) can be parked by it."""
    headroom: Callable[[bool], int] | None = None
    """Bytes it wants kept free on each GPU, given whether the GPUs are real; None: none."""


def _fake(i: BuildInputs) -> tuple[Backend, dict[str, int]]:
    from agent.parking.backends.fake import FakeBackend

    gpus, o = i.simulated(), i.opts
    try:
        backend = FakeBackend(o.fake_dir, gpus, o.fake_scale, o.pcie_gbps or None, o.lock_timeout_s)
    except OSError as exc:
        raise BackendUnavailable(
            f"--fake-dir {o.fake_dir}: cannot keep simulated device memory there ({exc.strerror})"
        ) from None
    return backend, gpus


def _cuda(i: BuildInputs) -> tuple[Backend, dict[str, int]]:
    from agent.parking.backends.cuda import CudaBackend
    from agent.parking.backends.cuda_driver import lock_timeout_ms

    cuda = CudaBackend(
        lock_timeout_ms=lock_timeout_ms(i.opts.lock_timeout_s),
        headroom_bytes=default_headroom(i.opts),
        call_timeout_s=i.opts.driver_call_timeout_s,
        copy_gbps=i.opts.slowest_copy_gbps,
    )
    return cuda, cuda.gpu_memory()


def _cuda_headroom(real: bool) -> int:
    from agent.parking.backends.cuda import DEFAULT_HEADROOM

    return DEFAULT_HEADROOM


def _app(i: BuildInputs) -> tuple[Backend, dict[str, int]]:
    from agent.parking.backends.app import AppBackend

    gpus = i.inventory()
    app = AppBackend(i.opts.callback_timeout_s, i.call_tenant, i.loop, i.opts.slowest_copy_gbps)
    return app, gpus


def _app_headroom(real: bool) -> int:
    """On real GPUs, room for what its parked tenants leave on the device."""
    from agent.parking.backends.app import PARKED_HEADROOM

    return PARKED_HEADROOM if real else 0


def _endpoint(i: BuildInputs) -> tuple[Backend, dict[str, int]]:
    from agent.parking.backends.endpoint import EndpointBackend

    return EndpointBackend(i.opts.callback_timeout_s, i.opts.slowest_copy_gbps), i.inventory()


METHODS: Mapping[str, ParkingMethod] = {
    m.name: m
    for m in (
        ParkingMethod(
            NONE, "parks nothing: every tenant stays resident", None, measures_gpus=False
        ),
        ParkingMethod(FAKE, "simulated GPUs: files copied to host memory", _fake, simulated=True),
        ParkingMethod(
            CUDA,
            "the driver's checkpoint of the tenant's processes",
            _cuda,
            headroom=_cuda_headroom,
        ),
        ParkingMethod(
            APP,
            "the tenant's own park/restore callbacks, over its session",
            _app,
            measures_gpus=False,
            self_parks=True,
            headroom=_app_headroom,
        ),
        ParkingMethod(
            ENDPOINT,
            "an inference engine's HTTP API (vLLM sleep, SGLang release)",
            _endpoint,
            measures_gpus=False,
            needs_target=True,
        ),
    )
}
"""Every parking method, in the order `--backend`'s help lists them."""

CHOICES = tuple(METHODS)
"""`--backend`'s choices (several may be listed, but `none` only alone)."""

PLAIN = tuple(m.name for m in METHODS.values() if not m.needs_target)
"""The methods that can park any tenant, with nothing configured for it (`baton bench
handoff`'s choices)."""


def parks_itself(method: str) -> bool:
    """Whether tenants moved by `method` park themselves (`app`)."""
    known = METHODS.get(method)
    return known is not None and known.self_parks


def described(methods: Collection[str] = CHOICES) -> str:
    """`none, fake, cuda, app or endpoint`: the methods for a help text."""
    *rest, last = methods
    return f"{', '.join(rest)} or {last}" if rest else last


def parking_methods(spec: str) -> tuple[str, ...]:
    """The methods `--backend` names (`fake`, `cuda,app`), or `BackendUnavailable`."""
    methods = tuple(dict.fromkeys(m.strip() for m in spec.split(",") if m.strip()))
    if len(methods) > 1 and NONE in methods:
        raise BackendUnavailable("--backend none parks nothing: list it alone")
    for method in methods:
        if method not in METHODS:
            raise BackendUnavailable(f"unknown backend {method!r}; choose one of {CHOICES}")
    return methods or (NONE,)


def default_headroom(opts: ParkingOptions, gpus: Mapping[str, int] | None = None) -> int:
    """Bytes kept free on each GPU: the flag's, else the most its methods want on `gpus` (on
    real GPUs, not simulated ones, the app method keeps room for what its parked tenants leave
    on the device)."""
    if opts.headroom_mib is not None:
        return opts.headroom_mib * MIB
    real = any(not g.startswith(FAKE_GPU_UUID_PREFIX) for g in gpus or {})
    wanted = (METHODS[m].headroom for m in parking_methods(opts.backend))
    return max((h(real) for h in wanted if h is not None), default=0)
