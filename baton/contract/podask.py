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
  without Baton GPUs do not count.
- Omitted values stay `None` (the placement core fills in the defaults per GPU: the whole GPU,
  100 / slots). An unusable ask is a `RequestError`, one line naming the field and the value.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from enum import StrEnum
from typing import Any

from baton.contract.names import RESOURCE_GPU, RESOURCE_GPU_DUTY, RESOURCE_GPU_MEMORY

MAX_GPUS_PER_POD = 64
MAX_GPU_MEMORY_MIB = 1 << 20
"""1 TiB per GPU: anything larger is a unit mistake, not a GPU."""

_BATON = (RESOURCE_GPU, RESOURCE_GPU_MEMORY, RESOURCE_GPU_DUTY)
_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)
_LARGEST = Decimal(2**63)
_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


class RequestError(ValueError):
    """A pod's Baton request is not usable; the message names the field and the value."""


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


def parse_quantity(text: object) -> Decimal:
    """A Kubernetes resource quantity (`"40960"`, `"64Gi"`, `"1e9"`, `"500m"`) as a number."""
    if not isinstance(text, str | int | float | Decimal) or isinstance(text, bool):
        raise ValueError(f"{shown(text)} is not a Kubernetes quantity")
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise ValueError(f"{shown(text)} is not a Kubernetes quantity")
    number, exponent, suffix = match.groups()
    try:
        value = Decimal(number)
    except InvalidOperation as err:  # pragma: no cover - the pattern admits only decimals
        raise ValueError(f"{text!r} is not a Kubernetes quantity") from err
    if exponent:
        value = value.scaleb(int(exponent[1:]))
    if suffix:
        value *= _SUFFIX[suffix]
    if abs(value) >= _LARGEST:  # past int64, and turning it into an int could take minutes
        raise ValueError(f"{shown(text)} is out of range (a quantity is below 2^63)")
    return value


def shown(value: object) -> str:
    """A value as an error message quotes it: its repr, cut short (no recursion, any size)."""
    return reprlib.repr(value)


class ContainerKind(StrEnum):
    """How a container runs within its pod."""

    APP = "app"
    INIT = "init"
    """Runs to completion, alone, before the app containers start."""
    SIDECAR = "sidecar"
    """An init container with `restartPolicy: Always`: it runs beside the app containers."""


@dataclass(frozen=True, slots=True)
class ContainerAsk:
    """What one container asks of Baton (`None`: it does not name the value)."""

    name: str
    kind: ContainerKind
    slots: int | None = None
    memory_mib: int | None = None
    """Per GPU."""
    duty: float | None = None
    memory_limit_bytes: int | None = None
    """Its memory limit; `None` when it has none."""
    values: tuple[Decimal | None, ...] = field(default=(), compare=False, repr=False)
    """slots, memory, duty as read, for summing exactly."""
    memory_written: str = field(default="", compare=False, repr=False)
    """`baton.dev/gpu-memory` as written (`24Gi`), for the reason when it is unusable."""


@dataclass(frozen=True, slots=True)
class PodAsk:
    """Every container's ask, init containers (sidecars among them) first, in spec order."""

    containers: tuple[ContainerAsk, ...]

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
        total = 0
        for container in self.containers:
            if not container.slots:
                continue  # only the containers that use Baton GPUs park GPU memory
            if container.memory_limit_bytes is None:
                return None
            total += container.memory_limit_bytes
        return total


def read_pod_ask(pod: Mapping[str, Any]) -> PodAsk:
    """Every container's ask (a `RequestError` for one that cannot be read)."""
    spec = _mapping(pod.get("spec"), "spec")
    app = _objects(spec.get("containers"), "spec.containers")
    init = _objects(spec.get("initContainers"), "spec.initContainers")
    return PodAsk(
        (
            *(_container_ask(c, _init_kind(c)) for c in init),
            *(_container_ask(c, ContainerKind.APP) for c in app),
        )
    )


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
        named = [n for n, v in zip(_BATON[1:], totals[1:], strict=True) if v is not None]
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
        return (len(app), *(c.get("resources") for c in app), *(c.get("resources") for c in init))
    except (AttributeError, TypeError):
        return None


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(f"pod {where} is not an object")
    return value


def _objects(value: Any, where: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise RequestError(f"pod {where} is not a list of objects")
    return value


def _init_kind(container: dict[str, Any]) -> ContainerKind:
    always = container.get("restartPolicy") == "Always"
    return ContainerKind.SIDECAR if always else ContainerKind.INIT


def _container_ask(container: dict[str, Any], kind: ContainerKind) -> ContainerAsk:
    resources = _mapping(container.get("resources"), "container resources")
    limits = _mapping(resources.get("limits"), "container resources.limits")
    requests = _mapping(resources.get("requests"), "container resources.requests")
    values: list[Decimal | None] = []
    for name in _BATON:
        raw = limits.get(name, requests.get(name))
        if raw is None:
            values.append(None)
            continue
        try:
            value = parse_quantity(raw)
        except ValueError:
            raise RequestError(f"{name} {shown(raw)} is not a number") from None
        values.append(value)
    slots, memory, duty = values
    return ContainerAsk(
        name=_name(container.get("name", "")),
        kind=kind,
        slots=None if slots is None else _whole(RESOURCE_GPU, slots),
        memory_mib=None if memory is None else _whole(RESOURCE_GPU_MEMORY, memory),
        duty=None if duty is None else float(duty),
        memory_limit_bytes=_memory_limit(limits.get("memory")),
        values=tuple(values),
        memory_written=str(limits.get(RESOURCE_GPU_MEMORY, requests.get(RESOURCE_GPU_MEMORY, ""))),
    )


def _name(name: object) -> str:
    return name if isinstance(name, str) else shown(name)


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


def _whole(name: str, value: Decimal) -> int:
    if value != value.to_integral_value():
        raise RequestError(f"{name} {value} is not a whole number")
    return int(value)


def _check_gpus(value: Decimal) -> int:
    count = _whole(RESOURCE_GPU, value)
    if count <= 0:
        raise RequestError(f"{RESOURCE_GPU} {count}: ask for at least 1 GPU")
    if count > MAX_GPUS_PER_POD:
        raise RequestError(f"{RESOURCE_GPU} {count} is more than {MAX_GPUS_PER_POD} GPUs per pod")
    return count


def _check_memory(value: Decimal, containers: tuple[ContainerAsk, ...]) -> int:
    mib = _whole(RESOURCE_GPU_MEMORY, value)
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


def _memory_limit(limit: object) -> int | None:
    if limit is None:
        return None
    try:
        return int(parse_quantity(limit))
    except ValueError:
        raise RequestError(f"memory limit {shown(limit)} is not a quantity") from None
