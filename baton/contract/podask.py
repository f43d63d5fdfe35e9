"""What a pod asks of Baton, read once for every daemon: per container, and for the pod.

The rules (the extender places by them, the device plugin steers by them, the agent parks by them):

- A container asks what its limits say, or its requests where no limit names the resource:
  `baton.dev/gpu` slots, `baton.dev/gpu-memory` MiB per GPU, `baton.dev/gpu-duty` percent of
  one GPU's time.
- The pod asks as kube-scheduler and the kubelet count: app containers and sidecars (init
  containers with `restartPolicy: Always`) run together and add up; an ordinary init container
  runs alone beside the sidecars started before it; the pod asks the larger of the two. So the
  duty on a GPU is the sum of what the containers placed on it ask.
- The memory limit that bounds parking is the summed memory limit of the containers that ask
  for `baton.dev/gpu`; one of them without a limit makes it unlimited (`None`); containers
  without Baton GPUs do not count. A pod-level memory limit (`spec.resources.limits`) bounds
  it too: the containers' cgroups sit inside the pod's.
- Omitted values stay `None` (the placement core fills in the defaults per GPU: the whole GPU,
  100 / slots). An unusable ask is a `RequestError`, one line naming the field and the value.

Each container's ask is read in `baton.contract.containerask`, its quantities in
`baton.contract.quantity`; this module adds them up for the pod, checks the pod's figures and
remembers them per pod (`RequestMemo`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any

from baton.contract.containerask import (
    BATON_RESOURCES,
    ContainerAsk,
    ContainerKind,
    RequestError,
    as_mapping,
    as_objects,
    container_ask,
    init_kind,
    memory_limit,
    whole,
)
from baton.contract.names import RESOURCE_GPU, RESOURCE_GPU_DUTY, RESOURCE_GPU_MEMORY
from baton.contract.quantity import parse_quantity, shown

__all__ = [
    "MAX_GPUS_PER_POD",
    "MAX_GPU_MEMORY_MIB",
    "ContainerAsk",
    "ContainerKind",
    "PodAsk",
    "RequestError",
    "RequestMemo",
    "TenantRequest",
    "parse_pod_request",
    "parse_quantity",
    "pod_request",
    "read_pod_ask",
    "shown",
]

MAX_GPUS_PER_POD = 64
MAX_GPU_MEMORY_MIB = 1 << 20
"""1 TiB per GPU: anything larger is a unit mistake, not a GPU."""


@dataclass(frozen=True, slots=True)
class TenantRequest:
    """What one pod asks of Baton."""

    gpus: int
    memory_mib: int | None = None
    """Per GPU; `None` means the whole GPU."""
    duty: float | None = None
    """Percent of each GPU's time; `None` means 100 / slots."""
    memory_limit_bytes: int | None = None
    """Summed memory limit of the containers that use Baton GPUs; `None` when any is unlimited."""


@dataclass(frozen=True, slots=True)
class PodAsk:
    """Every container's ask, init containers (sidecars among them) first, in spec order."""

    containers: tuple[ContainerAsk, ...]
    pod_memory_limit_bytes: int | None = None
    """The pod-level memory limit (`spec.resources.limits.memory`); `None` when it has none."""

    @property
    def slots(self) -> int:
        """The pod's `baton.dev/gpu` as kube-scheduler and the kubelet count it (0: none)."""
        total = _effective(0, self.containers)
        return 0 if total is None else int(total)

    @property
    def slot_asks(self) -> tuple[int, ...]:
        """Each GPU container's slots, in the kubelet's admission order."""
        return tuple(c.slots for c in self.containers if c.slots)

    def memory_limit_bytes(self) -> int | None:
        """The memory limit that bounds parking (see the module docstring)."""
        limits = [c.memory_limit_bytes for c in self.containers if c.slots]
        # only the containers that use Baton GPUs park GPU memory; one without a limit: none
        total = None if None in limits else sum(x or 0 for x in limits)
        pod = self.pod_memory_limit_bytes  # the pod's cgroup holds its containers' cgroups
        return pod if total is None else total if pod is None else min(total, pod)


def read_pod_ask(pod: Mapping[str, Any]) -> PodAsk:
    """Every container's ask (a `RequestError` for one that cannot be read)."""
    spec = as_mapping(pod.get("spec"), "spec")
    app = as_objects(spec.get("containers"), "spec.containers")
    init = as_objects(spec.get("initContainers"), "spec.initContainers")
    return PodAsk(
        (
            *(container_ask(c, init_kind(c)) for c in init),
            *(container_ask(c, ContainerKind.APP) for c in app),
        ),
        _pod_memory_limit(spec),
    )


def _pod_memory_limit(spec: Mapping[str, Any]) -> int | None:
    """The pod-level memory limit (`spec.resources`, Kubernetes' PodLevelResources), if any."""
    resources = as_mapping(spec.get("resources"), "spec.resources")
    limit = as_mapping(resources.get("limits"), "spec.resources.limits").get("memory")
    return memory_limit(limit, "pod memory limit")


def parse_pod_request(pod: Mapping[str, Any]) -> TenantRequest | None:
    """The pod's Baton request, or `None` when it asks for no Baton resource."""
    return pod_request(read_pod_ask(pod))


def pod_request(ask: PodAsk) -> TenantRequest | None:
    """The pod-level figures of an ask, checked; `None` when it names no Baton resource."""
    if not any(v is not None for c in ask.containers for v in c.values):
        return None
    totals = [_effective(i, ask.containers) for i in range(3)]
    gpus, memory, duty = totals
    if gpus is None:
        named = [n for n, v in zip(BATON_RESOURCES[1:], totals[1:], strict=True) if v is not None]
        raise RequestError(f"{' and '.join(named)} is set but {RESOURCE_GPU} is not")
    return TenantRequest(
        gpus=_check_gpus(gpus),
        memory_mib=None if memory is None else _check_memory(memory, ask.containers),
        duty=None if duty is None else _check_duty(duty, ask.containers),
        memory_limit_bytes=ask.memory_limit_bytes(),
    )


class RequestMemo:
    """`parse_pod_request`, remembered per pod UID while the pod's container resources stay
    the same.

    One pod is read several times on its way to a node: by filter and prioritize (from
    kube-scheduler's copy), by bind, and by the watch once it is bound. Comparing
    the containers' `resources` with the remembered ones is a C-level dict comparison, far
    cheaper than parsing the quantities again, and a resize (which changes them) is read
    afresh. Safe to share between threads: each step is one dict operation.
    """

    def __init__(self, size: int = 8192):
        self._size = size
        self._memo: dict[str, tuple[tuple[object, ...], TenantRequest | str | None]] = {}

    def __len__(self) -> int:
        """Pods remembered."""
        return len(self._memo)

    def request(self, pod: dict[str, Any]) -> TenantRequest | None:
        """As `parse_pod_request` (a `RequestError` for an unusable request)."""
        uid = (pod.get("metadata") or {}).get("uid")
        key = _resources_key(pod)
        if not isinstance(uid, str) or not uid or key is None:
            return parse_pod_request(pod)
        hit = self._memo.get(uid)
        if hit is None or _changed(hit[0], key):
            try:
                found: TenantRequest | str | None = parse_pod_request(pod)
            except RequestError as err:
                found = str(err)
            if len(self._memo) >= self._size:
                self._memo.clear()  # rare (a pod's entry goes when it does); cheap to refill
            hit = self._memo[uid] = (key, found)
        if isinstance(hit[1], str):
            raise RequestError(hit[1])
        return hit[1]

    def forget(self, uid: str) -> None:
        """The pod is gone."""
        self._memo.pop(uid, None)


def _changed(before: tuple[object, ...], now: tuple[object, ...]) -> bool:
    """The resources differ, or are nested too deep to compare (no pod's are: read afresh)."""
    try:
        return before != now
    except RecursionError:
        return True


def _resources_key(pod: dict[str, Any]) -> tuple[object, ...] | None:
    """Everything `parse_pod_request` reads: each container's and init container's
    `resources` (None for a pod shaped so oddly that the parser should say why)."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return None
    try:
        app, init = spec.get("containers") or (), spec.get("initContainers") or ()
        return (
            len(app),
            spec.get("resources"),  # the pod-level memory limit
            *(c.get("resources") for c in app),
            *(c.get("resources") for c in init),
        )
    except (AttributeError, TypeError):
        return None


def _effective(i: int, containers: tuple[ContainerAsk, ...]) -> Decimal | None:
    """Value `i` for the pod, counted as kube-scheduler counts it (`None`: nobody names it)."""
    if all(c.values[i] is None for c in containers):
        return None
    running = Decimal(0)  # app containers and the sidecars: they run together
    sidecars = Decimal(0)
    peak: Decimal | None = None  # the most an init container needs beside earlier sidecars
    for container in containers:
        value = container.values[i]
        if container.kind is ContainerKind.APP:
            running += value or 0
        elif value is not None:
            if container.kind is ContainerKind.SIDECAR:
                sidecars += value
                running += value
            during = sidecars if container.kind is ContainerKind.SIDECAR else sidecars + value
            peak = during if peak is None else max(peak, during)
    return running if peak is None else max(running, peak)


def _check_gpus(value: Decimal) -> int:
    count = whole(RESOURCE_GPU, value)
    if count <= 0:
        raise RequestError(f"{RESOURCE_GPU} {count}: ask for at least 1 GPU")
    if count > MAX_GPUS_PER_POD:
        raise RequestError(f"{RESOURCE_GPU} {count} is more than {MAX_GPUS_PER_POD} GPUs per pod")
    return count


def _check_memory(value: Decimal, containers: tuple[ContainerAsk, ...]) -> int:
    mib = whole(RESOURCE_GPU_MEMORY, value)
    if mib <= 0:
        raise RequestError(f"{RESOURCE_GPU_MEMORY} {mib} must be a positive number of MiB")
    if mib > MAX_GPU_MEMORY_MIB:
        for container in containers:
            _check_memory_unit(container.memory_written, container.values[1])
        raise RequestError(
            f"{RESOURCE_GPU_MEMORY} {mib} MiB is more than any GPU has"
            f" (it counts MiB: write 40960 for 40 GiB)"
        )
    return mib


def _check_memory_unit(written: str, value: Decimal | None) -> None:
    """A byte suffix (`24Gi`) on a count of MiB: name what was written and what it means."""
    written = written.strip()
    if value is None or value <= MAX_GPU_MEMORY_MIB or not written[-1:].isalpha():
        return
    meant = (value / (1 << 20)).to_integral_value(ROUND_CEILING)  # the bytes written, in MiB
    raise RequestError(
        f"{RESOURCE_GPU_MEMORY} {shown(written)} is {int(value)} MiB, more than any GPU has"
        f" (it counts MiB: write {int(meant)} for {written})"
    )


def _check_duty(value: Decimal, containers: tuple[ContainerAsk, ...]) -> float:
    if not 0 < value <= 100:
        together = [c for c in containers if c.kind is not ContainerKind.INIT]
        each = [f"{c.values[2]}" for c in together if c.values[2] is not None]
        summed = f": the pod's containers ask {' + '.join(each)}, and those running together add up"
        raise RequestError(
            f"{RESOURCE_GPU_DUTY} {value} is not above 0 and at most 100 (percent)"
            + (summed if len(each) > 1 else "")
        )
    return float(value)
