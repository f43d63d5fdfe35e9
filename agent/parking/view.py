"""The planner's view of one tenant: what it holds where, from the backend's state and its ask.

Pure: the preparer passes what it knows (the backend's `TenantState`, the tenant's `TenantRef`,
its method, the GPUs' sizes, when it last had a turn, its memory cgroup) and gets the
`TenantView` that `agent.core.planner` plans with, or the tenant's entry in /v1/status.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from agent.core.planner import TenantView
from agent.parking.backends.base import Residency, TenantRef, TenantState
from agent.parking.methods import parks_itself

_AWAY = (Residency.PARKED, Residency.PARKING, Residency.RESTORING)


def tenant_view(
    st: TenantState,
    ref: TenantRef | None,
    *,
    method: str,
    gpu_memory: Mapping[str, int],
    last_turn: float,
    busy: bool,
    cgroup: tuple[int | None, int],
    all_of_it: bool = False,
    headroom: int = 0,
) -> TenantView:
    """The tenant as the planner sees it.

    It holds on each GPU what the backend counts, or what it declared if that is more. A tenant
    that parks itself (`app`) and declared nothing may hold the whole GPU: what it holds is known
    only from what it reports at a park, and it may allocate during any turn. A GPU where it
    holds nothing and is not parked is `absent` (it has not allocated there since it joined),
    unless what it holds is unknown, or `all_of_it` counts it (it may have allocated since).
    A self-parker's report, or its whole GPU, counts at most what the GPU holds after the
    `headroom`: more is not all on that GPU, and must not refuse its turns as too large.
    """
    declared = ref.declared_bytes if ref and ref.declared_bytes else 0
    unknown = parks_itself(method) and not declared and ref is not None and ref.self_parks
    gpus = set(st.footprint_bytes) | set(ref.gpus if ref and declared else ())
    whole = {g: max(n - headroom, 0) for g, n in gpu_memory.items()} if unknown else {}
    counted = dict(st.footprint_bytes)
    if parks_itself(method):  # its own report: one past what the GPU can hold counts its other
        for g, n in counted.items():  # GPUs too (`TorchParker`'s first park moves them all)
            if g in gpu_memory:
                counted[g] = min(n, max(gpu_memory[g] - headroom, 0))
    footprint = {g: max(counted.get(g, 0), declared, whole.get(g, 0)) for g in gpus}
    parked = {g: st.footprint_bytes.get(g, 0) for g, r in st.residency.items() if r in _AWAY}
    allocated = {g for g in gpus - set(parked) if st.footprint_bytes.get(g)}
    absent = set() if unknown or all_of_it else gpus - set(parked) - allocated
    limit = ref.memory_limit_bytes if ref and ref.memory_limit_bytes else None
    found_limit, used = cgroup
    return TenantView(
        st.tenant_id,
        footprint=footprint,
        parked=parked,
        last_turn=last_turn,
        memory_limit=limit if limit is not None else found_limit,
        busy=busy,
        absent=frozenset(absent),
        memory_used=used,
        unparkable=st.quarantined or st.unparkable,
        method=method,
    )


def away(st: TenantState) -> bool:
    """Whether any of the tenant's memory is parked, or on its way out or back (its view's
    `parked` is not empty)."""
    return any(r in _AWAY for r in st.residency.values())


def gpu_residency(st: TenantState) -> dict[str, str]:
    """GPU → where the tenant's memory is there (its status entry's `gpus`)."""
    return {g: r.value for g, r in sorted(st.residency.items())}


def tenant_status(
    st: TenantState,
    view: TenantView,
    *,
    method: str,
    last_turn_wall: float | None,
    quarantined: str,
    waiting: str | None,
) -> dict[str, Any]:
    """One tenant's entry in /v1/status: where its memory is, and why it waits if it does."""
    kinds = set(st.residency.values())
    when = last_turn_wall
    entry: dict[str, Any] = {
        "residency": kinds.pop().value if len(kinds) == 1 else "mixed" if kinds else "none",
        "gpus": gpu_residency(st),
        "footprint_bytes": sum(st.footprint_bytes.values()),
        "parked_bytes": st.parked_bytes,
        "method": method,
        "last_turn": dt.datetime.fromtimestamp(when, dt.UTC).isoformat() if when else None,
    }
    if view.cgroup_blocks_park():
        entry["not_parkable"] = (
            f"memory limit {view.memory_limit} bytes cannot hold its "
            f"{sum(view.footprint.values())} bytes of GPU memory on top of the "
            f"{view.memory_used} bytes it uses"
        )
    if st.unparkable:
        entry["not_parkable"] = st.unparkable
    if quarantined:  # its memory is wherever the driver left it: not "resident"
        entry["residency"] = "quarantined"
        entry["quarantined"] = quarantined
    if st.pids:
        entry["pids"] = list(st.pids)
    if st.detail:
        entry["detail"] = st.detail
    if waiting is not None:
        entry["waiting"] = waiting
    return entry
