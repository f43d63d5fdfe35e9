"""The numbers behind DRA's "cannot allocate all claims": for each of Baton's devices, which
capacity (memory, duty, slots) lacks how much against what the pod's claims ask."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from baton.contract import names
from baton.contract.quantity import parse_quantity
from commands.kubectl.api import Api, NotFound

DRA_REFUSAL = "cannot allocate all claims"
CAPACITIES = (names.DRA_CAPACITY_MEMORY, names.DRA_CAPACITY_DUTY, names.DRA_CAPACITY_SLOTS)
Device = tuple[str, str]
"""(pool, device name)."""


def dra_shortfall(api: Api, pod: Mapping[str, Any]) -> list[str]:
    """One sentence per device of Baton's driver saying what it lacks for this pod."""
    slices = api.get(
        "/apis/resource.k8s.io/v1/resourceslices", fieldSelector=f"spec.driver={names.DRA_DRIVER}"
    )
    claims = api.get("/apis/resource.k8s.io/v1/resourceclaims")
    asks = pod_asks(api, pod)
    return shortfall(slices.get("items") or [], claims.get("items") or [], asks)


def pod_asks(api: Api, pod: Mapping[str, Any]) -> list[dict[str, Decimal | None]]:
    """What each device request of the pod's Baton claims asks of one device (None: the
    device's default), and one default ask per container's `baton.dev/gpu` limit (its claim,
    made only at binding, has a request per container). A request's `count` devices are
    distinct: a device holds at most one of its shares."""
    namespace = pod["metadata"]["namespace"]
    made = {
        s["name"]: s.get("resourceClaimName")
        for s in pod["status"].get("resourceClaimStatuses") or []
    }
    asks: list[dict[str, Decimal | None]] = []
    for entry in pod["spec"].get("resourceClaims") or []:
        claim_name = entry.get("resourceClaimName") or made.get(entry["name"])
        if not claim_name:
            continue
        try:
            claim = api.get(
                f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{claim_name}"
            )
        except NotFound:
            continue
        for request in (claim.get("spec") or {}).get("devices", {}).get("requests") or []:
            exactly = request.get("exactly") or {}
            if exactly.get("deviceClassName") != names.DRA_DEVICE_CLASS:
                continue
            wanted = (exactly.get("capacity") or {}).get("requests") or {}
            ask = {**dict.fromkeys(CAPACITIES), **{c: parse_quantity(v) for c, v in wanted.items()}}
            asks.append(ask)
    for container in pod["spec"].get("containers") or []:
        count = int((container.get("resources") or {}).get("limits", {}).get(names.RESOURCE_GPU, 0))
        asks += [dict.fromkeys(CAPACITIES)] if count else []
    return asks


def shortfall(
    slices: Sequence[Mapping[str, Any]],
    claims: Sequence[Mapping[str, Any]],
    asks: Sequence[Mapping[str, Decimal | None]],
) -> list[str]:
    """Pure: per device, its capacities less what allocated claims consumed, against what the
    pod's requests (`asks`, one share each) would take of it together."""
    used = consumed(claims)
    lines = []
    for piece in slices:
        pool = piece["spec"].get("pool", {}).get("name", piece["spec"].get("nodeName", ""))
        for device in piece["spec"].get("devices") or []:
            lines.append(device_line(pool, device, used.get((pool, device["name"]), {}), asks))
    return lines or [f"no ResourceSlice of {names.DRA_DRIVER} publishes any device"]


def consumed(claims: Sequence[Mapping[str, Any]]) -> dict[Device, dict[str, Decimal]]:
    """(pool, device) → capacity consumed by allocated claims (a slot per allocation)."""
    used: dict[Device, dict[str, Decimal]] = {}
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") != names.DRA_DRIVER:
                continue
            per = used.setdefault((result.get("pool", ""), result.get("device", "")), {})
            taken = dict(result.get("consumedCapacity") or {})
            taken.setdefault(names.DRA_CAPACITY_SLOTS, "1")
            for capacity, value in taken.items():
                per[capacity] = per.get(capacity, Decimal(0)) + parse_quantity(value)
    return used


def device_line(
    pool: str,
    device: Mapping[str, Any],
    used: Mapping[str, Decimal],
    asks: Sequence[Mapping[str, Decimal | None]],
) -> str:
    """`pool/device: lacks memory (4 GiB free of 160 GiB, 30 GiB asked); ...` or `fits`."""
    uuid = (device.get("attributes") or {}).get(names.DRA_ATTRIBUTE_UUID, {}).get("string", "")
    where = f"{pool}/{device['name']}" + (f" ({uuid})" if uuid else "")
    if any(t.get("effect") == "NoSchedule" for t in device.get("taints") or []):
        return f"{where}: tainted {', '.join(t['key'] for t in device['taints'])}"
    capacities = device.get("capacity") or {}
    unknown = sorted({c for a in asks for c, v in a.items() if v is not None} - set(capacities))
    if unknown:
        has = ", ".join(sorted(capacities))
        return f"{where}: has no capacity {', '.join(unknown)} (it has {has})"
    alone = [_lacks(capacities, used, [ask]) for ask in asks] or [_lacks(capacities, used, [])]
    if all(alone):  # no request of the pod's fits it (the first one's shortfall)
        return f"{where}: lacks {'; '.join(alone[0])}"
    together = _lacks(capacities, used, asks) if len(asks) > 1 else []
    if together:  # the scheduler may give the pod's requests other devices
        return f"{where}: has room for one share, not the pod's {len(asks)} together: " + "; ".join(
            together
        )
    return f"{where}: has room for the ask"


def _lacks(
    capacities: Mapping[str, Any],
    used: Mapping[str, Decimal],
    asks: Sequence[Mapping[str, Decimal | None]],
) -> list[str]:
    """What the device lacks to hold one share of each of `asks` at once (none: it can)."""
    lacks = []
    for capacity, spec in sorted(capacities.items()):
        total = parse_quantity(spec.get("value", "0"))
        policy = spec.get("requestPolicy") or {}
        default = policy.get("default")
        wants = [a.get(capacity) for a in asks] or [None]
        each = [w if w is not None else parse_quantity(default or "0") for w in wants]
        asked = max(each)
        most = _share_most(policy)
        free = total - used.get(capacity, Decimal(0))
        if most is not None and asked > most:
            lacks.append(
                f"{capacity} (at most {_shown(capacity, most)} per share, "
                f"{_shown(capacity, asked)} asked)"
            )
        elif free < (needs := sum((_consumes(policy, w) for w in each), Decimal(0))):
            by = f" by the pod's {len(each)} requests" if len(each) > 1 else ""
            lacks.append(
                f"{capacity} ({_shown(capacity, free)} free of {_shown(capacity, total)}, "
                f"{_shown(capacity, needs)} asked{by})"
            )
    return lacks


def _share_most(policy: Mapping[str, Any]) -> Decimal | None:
    """The most one share may consume under the capacity's request policy (None: no limit);
    the scheduler refuses the device to a request above it, whatever is free."""
    most = (policy.get("validRange") or {}).get("max")
    if most is not None:
        return parse_quantity(most)
    valid = policy.get("validValues") or []
    return max(parse_quantity(v) for v in valid) if valid else None


def _consumes(policy: Mapping[str, Any], asked: Decimal) -> Decimal:
    """What a share asking `asked` consumes: rounded up to the range's minimum or to the next
    valid value, as the scheduler rounds it."""
    least = (policy.get("validRange") or {}).get("min")
    if least is not None:
        asked = max(asked, parse_quantity(least))
    above = [v for v in map(parse_quantity, policy.get("validValues") or []) if v >= asked]
    return min(above) if above else asked


def _shown(capacity: str, value: Decimal) -> str:
    if capacity == names.DRA_CAPACITY_MEMORY:
        return f"{value / (1 << 30):.1f} GiB"
    plain = f"{Decimal(value).normalize():f}"
    return f"{plain}%" if capacity == names.DRA_CAPACITY_DUTY else plain
