"""The pure core of leader election with a `coordination.k8s.io/v1` Lease whose
`leaseTransitions` is the epoch: from the Lease as read, who we are and the time, `decide` says
renew, take over or wait; `lease_record` and `lease_object` map the API server's JSON."""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from baton.contract.kube import parse_timestamp_ns


@dataclass(frozen=True)
class LeaseRecord:
    """A Lease's spec as read or to be written; times in seconds since the Unix epoch."""

    holder: str = ""
    """The holder's identity; empty when free (never held, or released)."""
    duration_s: int = 0
    renew_time: float | None = None
    acquire_time: float | None = None
    transitions: int = 0
    """How many times leadership changed hands: the epoch of the current term."""
    resource_version: str = ""
    """Empty for a Lease not yet created."""


@dataclass(frozen=True)
class Candidate:
    """Who asks: identity, the Lease duration it writes, the epoch it leads with now (None when
    not leading), and the highest epoch it has seen (so a deleted Lease cannot reuse one)."""

    identity: str
    lease_duration_s: int
    term: int | None = None
    highest_epoch: int = 0


class Action(enum.Enum):
    RENEW = "renew"
    TAKE = "take over"
    WAIT = "wait"


@dataclass(frozen=True)
class Decision:
    """What to do, and the Lease to write (RENEW, TAKE) or the one that was read (WAIT)."""

    action: Action
    lease: LeaseRecord


def expires_at(lease: LeaseRecord, seen_at: float | None, default_duration_s: int) -> float:
    """When the holder's claim lapses: a duration after we first saw that renewal by our own
    clock. The holder's renewTime (by its clock) counts only when we have not seen it: clocks
    that disagree between machines neither cut a holder short nor keep a dead one in office."""
    start = seen_at if seen_at is not None else lease.renew_time
    if start is None:
        return float("-inf")
    return start + (lease.duration_s or default_duration_s)


def decide(
    lease: LeaseRecord | None, me: Candidate, now: float, seen_at: float | None = None
) -> Decision:
    """Renew our own term, take over a free, expired or stale-term Lease, else wait."""
    if lease is None:
        return Decision(Action.TAKE, _taken(LeaseRecord(), me, now))
    ours = lease.holder == me.identity
    if ours and me.term is not None and lease.transitions == me.term:
        renewed = replace(lease, duration_s=me.lease_duration_s, renew_time=now)
        return Decision(Action.RENEW, renewed)
    free = not lease.holder or expires_at(lease, seen_at, me.lease_duration_s) < now
    if ours or free:
        return Decision(Action.TAKE, _taken(lease, me, now))
    return Decision(Action.WAIT, lease)


def _taken(lease: LeaseRecord, me: Candidate, now: float) -> LeaseRecord:
    """The Lease as we take it over: held by us from now, in a new, higher epoch."""
    epoch = max(lease.transitions, me.highest_epoch) + 1
    taken = replace(lease, holder=me.identity, duration_s=me.lease_duration_s, transitions=epoch)
    return replace(taken, renew_time=now, acquire_time=now)


class TimingError(ValueError):
    """Lease timings that cannot work; `name` is the argument at fault, `problem` says why."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name} {problem}")
        self.name = name
        self.problem = problem


JITTER_FACTOR = 1.2
"""client-go's leader election refuses a renew deadline of at most this many retry periods: a
leader renews once a retry period and must finish each renewal before its deadline."""


def check_timing(
    lease_duration_s: int,
    renew_deadline_s: float,
    retry_period_s: float,
    names: tuple[str, str, str] = ("lease_duration_s", "renew_deadline_s", "retry_period_s"),
) -> None:
    """TimingError unless 0 < JITTER_FACTOR * retry_period_s < renew_deadline_s <
    lease_duration_s (client-go's rule); `names` are the three as the caller's user knows them
    (its flags)."""
    duration, deadline, retry = names
    if not isinstance(lease_duration_s, int) or lease_duration_s < 1:
        raise TimingError(duration, f"must be a whole number >= 1, not {lease_duration_s!r}")
    if not 0 < renew_deadline_s < lease_duration_s:
        raise TimingError(
            deadline,
            f"must be > 0 and < {duration} ({lease_duration_s:g}), not {renew_deadline_s!r}",
        )
    if not 0 < JITTER_FACTOR * retry_period_s < renew_deadline_s:
        raise TimingError(
            retry,
            f"must be > 0 and < {deadline} / {JITTER_FACTOR:g} "
            f"({renew_deadline_s / JITTER_FACTOR:.4g}), not {retry_period_s!r} (a leader renews "
            "once a retry period and must finish each renewal before its renew deadline)",
        )


def lease_record(obj: dict[str, Any]) -> LeaseRecord:
    """A Lease object (the API server's JSON) as a record."""
    spec = obj.get("spec") or {}
    return LeaseRecord(
        holder=spec.get("holderIdentity") or "",
        duration_s=int(spec.get("leaseDurationSeconds") or 0),
        renew_time=_seconds(spec.get("renewTime")),
        acquire_time=_seconds(spec.get("acquireTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str((obj.get("metadata") or {}).get("resourceVersion") or ""),
    )


def lease_object(lease: LeaseRecord, base: dict[str, Any]) -> dict[str, Any]:
    """`base` (the Lease as read, or a bare one) with the record's spec and resourceVersion."""
    metadata = {**(base.get("metadata") or {}), "resourceVersion": lease.resource_version or None}
    spec = {
        **(base.get("spec") or {}),
        "holderIdentity": lease.holder or None,
        "leaseDurationSeconds": lease.duration_s or None,
        "renewTime": _micro_time(lease.renew_time),
        "acquireTime": _micro_time(lease.acquire_time),
        "leaseTransitions": lease.transitions,
    }
    return {**base, "metadata": metadata, "spec": spec}


def _seconds(text: str | None) -> float | None:
    if not text:
        return None
    whole, ns = divmod(parse_timestamp_ns(text), 1_000_000_000)
    return whole + ns / 1e9


def _micro_time(seconds: float | None) -> str | None:
    # MicroTime wants exactly six fraction digits; datetime.isoformat drops them at .000000.
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
