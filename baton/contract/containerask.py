"""What one container asks of Baton, read from its `resources` (`baton.contract.podask` adds the
containers up for the pod): its limits, or its requests where no limit names the resource. An
unusable value is a `RequestError`, one line naming the field and the value."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any

from baton.contract.names import RESOURCE_GPU, RESOURCE_GPU_DUTY, RESOURCE_GPU_MEMORY
from baton.contract.quantity import parse_quantity, shown

BATON_RESOURCES = (RESOURCE_GPU, RESOURCE_GPU_MEMORY, RESOURCE_GPU_DUTY)
"""The resources a container asks of Baton, in the order of `ContainerAsk.values`."""


class RequestError(ValueError):
    """A pod's Baton request is not usable; the message names the field and the value."""


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


def as_mapping(value: Any, where: str) -> dict[str, Any]:
    """`value` as an object (`{}` when absent); `where` names it in the error."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(f"pod {where} is not an object")
    return value


def as_objects(value: Any, where: str) -> list[dict[str, Any]]:
    """`value` as a list of objects (`[]` when absent); `where` names it in the error."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise RequestError(f"pod {where} is not a list of objects")
    return value


def init_kind(container: dict[str, Any]) -> ContainerKind:
    """An init container's kind: a sidecar when it restarts `Always`."""
    always = container.get("restartPolicy") == "Always"
    return ContainerKind.SIDECAR if always else ContainerKind.INIT


def container_ask(container: dict[str, Any], kind: ContainerKind) -> ContainerAsk:
    """What `container` asks (a `RequestError` for a value that cannot be read)."""
    resources = as_mapping(container.get("resources"), "container resources")
    limits = as_mapping(resources.get("limits"), "container resources.limits")
    requests = as_mapping(resources.get("requests"), "container resources.requests")
    values: list[Decimal | None] = []
    for name in BATON_RESOURCES:
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
        slots=None if slots is None else whole(RESOURCE_GPU, slots),
        memory_mib=None if memory is None else whole(RESOURCE_GPU_MEMORY, memory),
        duty=None if duty is None else float(duty),
        memory_limit_bytes=memory_limit(limits.get("memory")),
        values=tuple(values),
        memory_written=str(limits.get(RESOURCE_GPU_MEMORY, requests.get(RESOURCE_GPU_MEMORY, ""))),
    )


def whole(name: str, value: Decimal) -> int:
    """`value` of resource `name` as an int; a fraction is a `RequestError`."""
    if value != value.to_integral_value():
        raise RequestError(f"{name} {value} is not a whole number")
    return int(value)


def _name(name: object) -> str:
    return name if isinstance(name, str) else shown(name)


def memory_limit(limit: object, what: str = "memory limit") -> int | None:
    """Bytes of a memory limit (`None`: none); a `RequestError` naming `what` where it is no
    quantity."""
    if limit is None:
        return None
    try:
        return int(parse_quantity(limit))
    except ValueError:
        raise RequestError(f"{what} {shown(limit)} is not a quantity") from None
