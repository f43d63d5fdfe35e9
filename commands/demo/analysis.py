"""Who held each GPU when, and what that adds up to: a pure reading of the agent's events.

Busy time is time a tenant holds its turn, as the agent granted and ended it; time spent
parking or restoring memory while nobody holds the GPU is not busy.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.core import events as ev

ENDS = (ev.YIELDED, ev.REVOKED)


@dataclass(frozen=True)
class Hold:
    """One turn on one GPU, in the agent's clock."""

    gpu: str
    tenant_id: str
    lease_id: str
    start: float
    end: float
    token: int = 0


def holds(events: Iterable[ev.Event], end_of_run: float) -> list[Hold]:
    """Turns from granted to yielded, revoked or tenant_gone; open ones end at `end_of_run`."""
    open_: dict[str, ev.Event] = {}
    done: list[Hold] = []

    def close(grant: ev.Event, at: float) -> None:
        for gpu in grant.gpus:
            token = grant.tokens.get(gpu, 0)
            done.append(Hold(gpu, grant.tenant_id, grant.lease_id, grant.at, at, token))

    for e in events:
        if e.kind == ev.GRANTED:
            open_[e.lease_id] = e
        elif e.kind in ENDS and e.lease_id in open_:
            close(open_.pop(e.lease_id), e.at)
        elif e.kind == ev.TENANT_GONE:
            for lease_id, grant in list(open_.items()):
                if grant.tenant_id == e.tenant_id:
                    close(open_.pop(lease_id), e.at)
    for grant in open_.values():
        close(grant, end_of_run)
    return sorted(done, key=lambda h: (h.gpu, h.start))


def on_gpu(all_holds: Iterable[Hold], gpu: str) -> list[Hold]:
    """The holds of one GPU, in time order."""
    return [h for h in all_holds if h.gpu == gpu]


def busy_seconds(gpu_holds: Iterable[Hold], t0: float, t1: float) -> float:
    """Seconds of [t0, t1] during which the GPU was held."""
    return sum(max(0.0, min(h.end, t1) - max(h.start, t0)) for h in gpu_holds)


def cycle_duty(gpu_holds: Sequence[Hold], t0: float, t1: float) -> float:
    """Busy share of the GPU over the whole cycles in [t0, t1]: from the first grant in the
    window to the last, counting the holds that start in that span.

    A window that is not a whole number of cycles over-counts or under-counts one GPU phase,
    and tenants that start together make that error the same for each of them; measuring
    from grant to grant removes it. Falls back to busy ÷ wall with fewer than two grants.
    """
    starts = [h.start for h in gpu_holds if t0 <= h.start <= t1]
    if len(starts) < 2 or t1 <= t0:
        return busy_seconds(gpu_holds, t0, t1) / (t1 - t0) if t1 > t0 else 0.0
    first, last = min(starts), max(starts)
    busy = sum(h.end - h.start for h in gpu_holds if first <= h.start < last)
    return busy / (last - first)


def switches(gpu_holds: Sequence[Hold], t0: float, t1: float) -> int:
    """Grants in [t0, t1] that passed the GPU to a different tenant than the one before."""
    return sum(
        1
        for before, after in itertools.pairwise(gpu_holds)
        if after.tenant_id != before.tenant_id and t0 <= after.start <= t1
    )


def idle_wait_spans(
    gpu_holds: Sequence[Hold], requested: Mapping[str, float], t0: float, t1: float
) -> list[tuple[float, float]]:
    """Per turn granted in [t0, t1], the span the GPU sat idle while its next holder was
    already asking for it: making room (parks, restores) plus the grant's own latency.
    `requested`: lease id → when its tenant asked."""
    spans = []
    free_since = float("-inf")
    for hold in gpu_holds:
        asked = requested.get(hold.lease_id)
        if asked is not None and t0 <= hold.start <= t1:
            spans.append((min(hold.start, max(free_since, asked, t0)), hold.start))
        free_since = max(free_since, hold.end)
    return spans


def idle_waits(
    gpu_holds: Sequence[Hold], requested: Mapping[str, float], t0: float, t1: float
) -> list[float]:
    """The lengths of `idle_wait_spans`."""
    return [end - start for start, end in idle_wait_spans(gpu_holds, requested, t0, t1)]


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-quantile (0..1), nearest rank; 0 for no samples."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
