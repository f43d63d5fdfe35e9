"""What a pod holds on the DRA path: its claims' allocations, read once for every daemon.

A ResourceClaim's `status.allocation.devices.results` names, per request, the driver, pool and
device it got, and (for a shared device) its `shareID` and `consumedCapacity`. A pod names its
claims in `spec.resourceClaims`, its containers name theirs in `resources.claims`, and a claim
the scheduler made for a plain `baton.dev/gpu` ask is in `status.extendedResourceClaimStatus`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from baton.contract import names
from baton.contract.quantity import parse_quantity


@dataclass(frozen=True, slots=True)
class ClaimShare:
    """One allocation result of a claim served by Baton's driver."""

    request: str
    pool: str
    device: str
    share_id: str | None = None
    memory_bytes: int | None = None
    duty: float | None = None


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the API names it."""

    namespace: str
    name: str


def claim_shares(
    claim: Mapping[str, Any], driver: str = names.DRA_DRIVER
) -> tuple[ClaimShare, ...]:
    """The results of `claim` served by `driver` (none until it is allocated)."""
    status = claim.get("status") or {}
    devices = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    shares = []
    for result in devices:
        if not isinstance(result, Mapping) or result.get("driver") != driver:
            continue
        consumed = result.get("consumedCapacity") or {}
        shares.append(
            ClaimShare(
                request=str(result.get("request", "")),
                pool=str(result.get("pool", "")),
                device=str(result.get("device", "")),
                share_id=result.get("shareID"),
                memory_bytes=_whole(consumed.get(names.DRA_CAPACITY_MEMORY)),
                duty=_number(consumed.get(names.DRA_CAPACITY_DUTY)),
            )
        )
    return tuple(shares)


def pod_claim_refs(pod: Mapping[str, Any]) -> dict[str, tuple[ClaimRef, ...]]:
    """Container name → the claims it uses (init containers too), as API objects' names.

    A template's claim is named in `status.resourceClaimStatuses`; one not made yet is left out.
    """
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    status = pod.get("status") or {}
    namespace = str(meta.get("namespace", ""))
    generated = {
        s.get("name"): s.get("resourceClaimName")
        for s in status.get("resourceClaimStatuses") or []
        if isinstance(s, Mapping)
    }
    by_pod_name: dict[str, str] = {}
    for entry in spec.get("resourceClaims") or []:
        name = entry.get("name")
        claim = entry.get("resourceClaimName") or generated.get(name)
        if name and claim:
            by_pod_name[name] = claim
    refs: dict[str, list[ClaimRef]] = {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for used in (container.get("resources") or {}).get("claims") or []:
            claim = by_pod_name.get(used.get("name"))
            if claim:
                _add(refs, container.get("name", ""), ClaimRef(namespace, claim))
    extended = status.get("extendedResourceClaimStatus") or {}
    if extended.get("resourceClaimName"):
        for mapping in extended.get("requestMappings") or []:
            ref = ClaimRef(namespace, extended["resourceClaimName"])
            _add(refs, mapping.get("containerName", ""), ref)
    return {name: tuple(each) for name, each in refs.items()}


def _add(refs: dict[str, list[ClaimRef]], container: str, ref: ClaimRef) -> None:
    if ref not in refs.setdefault(container, []):
        refs[container].append(ref)


@dataclass(frozen=True, slots=True)
class DraAsk:
    """A pod's GPUs and share on the DRA path, as the agent keeps them."""

    container_devices: Mapping[str, tuple[str, ...]]
    """Container name → its devices (`gpu-<index>`), sorted."""
    memory_mib: int | None
    """The largest memory share of any of its results, MiB; None: some result names none."""
    duty: float | None
    """The largest duty share; None: some result names none."""


def pod_dra_ask(
    refs: Mapping[str, Iterable[ClaimRef]],
    shares: Mapping[ClaimRef, tuple[ClaimShare, ...]],
    pool: str,
) -> DraAsk:
    """What the pod's claims on `pool` (a node) give each container, and its share."""
    devices: dict[str, tuple[str, ...]] = {}
    results: list[ClaimShare] = []
    for container, claims in refs.items():
        found = {
            s.device for ref in claims for s in shares.get(ref, ()) if s.pool == pool and s.device
        }
        results += [s for ref in claims for s in shares.get(ref, ()) if s.pool == pool]
        if found:
            devices[container] = tuple(sorted(found))
    memory = [s.memory_bytes for s in results if s.memory_bytes is not None]
    duty = [s.duty for s in results if s.duty is not None]
    whole = bool(results) and len(memory) == len(results)
    return DraAsk(
        devices,
        max(memory) // names.MIB if whole else None,
        max(duty) if duty and len(duty) == len(results) else None,
    )


@dataclass(frozen=True, slots=True)
class ClaimAsk:
    """One request of a claim for Baton's device class, as its spec asks it."""

    request: str
    count: int
    memory_bytes: int | None = None
    """None: the class default (the whole GPU's memory)."""
    duty: float | None = None
    """None: the class default (`100 / slots`)."""


def claim_asks(
    claim: Mapping[str, Any], device_class: str = names.DRA_DEVICE_CLASS
) -> tuple[ClaimAsk, ...]:
    """The requests of `claim` for `device_class`, from `spec.devices.requests[].exactly`.

    Raises ValueError for a capacity that is not a quantity (filter shows it).
    """
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    asks = []
    for entry in requests:
        exactly = entry.get("exactly") if isinstance(entry, Mapping) else None
        if not isinstance(exactly, Mapping) or exactly.get("deviceClassName") != device_class:
            continue
        wanted = (exactly.get("capacity") or {}).get("requests") or {}
        asks.append(
            ClaimAsk(
                request=str(entry.get("name", "")),
                count=int(exactly.get("count") or 1),
                memory_bytes=_whole(wanted.get(names.DRA_CAPACITY_MEMORY)),
                duty=_number(wanted.get(names.DRA_CAPACITY_DUTY)),
            )
        )
    return tuple(asks)


def claim_ref(claim: Mapping[str, Any]) -> ClaimRef:
    """How pods name `claim`."""
    meta = claim.get("metadata") or {}
    return ClaimRef(str(meta.get("namespace", "")), str(meta.get("name", "")))


def reserved_pods(claim: Mapping[str, Any]) -> tuple[str, ...]:
    """UIDs of the pods `claim` is reserved for (`status.reservedFor`)."""
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    return tuple(
        str(r["uid"])
        for r in reserved
        if isinstance(r, Mapping) and r.get("resource") == "pods" and r.get("uid")
    )


def device_index(device: str) -> int | None:
    """The GPU index of a device named `gpu-<index>`, else None."""
    prefix = names.DRA_DEVICE_PREFIX
    digits = device[len(prefix) :] if device.startswith(prefix) else ""
    return int(digits) if digits.isdigit() else None


def device_uuids(
    slices: Iterable[Mapping[str, Any]], driver: str = names.DRA_DRIVER
) -> dict[str, str]:
    """Device name → GPU UUID from a node's ResourceSlices of `driver` (the `uuid` attribute)."""
    found = {}
    for each in slices:
        spec = each.get("spec") or {}
        if spec.get("driver") != driver:
            continue
        for device in spec.get("devices") or []:
            uuid = ((device.get("attributes") or {}).get(names.DRA_ATTRIBUTE_UUID) or {}).get(
                "string"
            )
            if device.get("name") and uuid:
                found[device["name"]] = uuid
    return found


def _whole(value: object) -> int | None:
    return None if value is None else int(parse_quantity(value))


def _number(value: object) -> float | None:
    return None if value is None else float(parse_quantity(value))
