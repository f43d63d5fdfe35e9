"""Invariants of a run, read from the agent's event stream and the backend's moves. Pure.

Feed `event()` with the agent's events (WatchEvents) and `move()` with completed parks and
restores, in any order; `check()` replays them in time order and returns the violations and
the figures (turns per tenant, Jain's fairness index, handoffs per second, longest wait).
With a `WaitBound` (`agent.core.waitbound`, the bound fifo and lrs keep), each waiter is judged
on its own: no more turns ahead of it than the policy allows, a wait within the bound for the
turns it actually waited behind, and no contended turn held past the maximum.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from agent.core.waitbound import WaitBound

PARK = "park"
RESTORE = "restore"


@dataclass(frozen=True)
class Record:
    """One event or move; moves sort before events at the same instant (they cause them)."""

    at: float
    order: int
    kind: str
    tenant_id: str
    gpus: tuple[str, ...] = ()
    lease_id: str = ""
    tokens: Mapping[str, int] = field(default_factory=dict)
    started: float = 0.0


@dataclass
class Report:
    """What a run showed."""

    violations: list[str]
    turns: dict[str, int]
    fairness: float
    grants: int
    handoffs: int
    seconds: float
    max_wait: float
    parks: int
    restores: int
    revocations: int
    handovers: list[float] = field(default_factory=list)
    """Seconds from each turn's end to the next grant on the same GPU."""

    @property
    def handoffs_per_s(self) -> float:
        return self.handoffs / self.seconds if self.seconds > 0 else 0.0

    def figures(self) -> dict[str, Any]:
        """The figures for docs/reliability.md."""
        return {
            "tenants": len(self.turns),
            "grants": self.grants,
            "handoffs": self.handoffs,
            "handoffs_per_s": round(self.handoffs_per_s, 1),
            "jain_fairness": round(self.fairness, 4),
            "max_wait_s": round(self.max_wait, 3),
            "parks": self.parks,
            "restores": self.restores,
            "revocations": self.revocations,
            "handover_p99_s": round(_quantile(self.handovers, 0.99), 3),
            "handover_max_s": round(max(self.handovers, default=0.0), 3),
            "violations": len(self.violations),
        }


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else 0.0


def jain(values: Iterable[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one takes everything."""
    xs = list(values)
    square_sum = sum(x * x for x in xs)
    return sum(xs) ** 2 / (len(xs) * square_sum) if square_sum else 1.0


class InvariantChecker:
    """Collects a run's records; `check(max_wait)` judges them."""

    def __init__(self) -> None:
        self._records: list[Record] = []

    def event(self, kind: str, tenant_id: str, at: float, **fields: Any) -> None:
        """One event of the agent's stream."""
        gpus = tuple(fields.get("gpus", ()))
        tokens = dict(fields.get("tokens", {}))
        lease = str(fields.get("lease_id", ""))
        self._records.append(Record(at, 1, kind, tenant_id, gpus, lease, tokens))

    def move(self, direction: str, tenant_id: str, gpu: str, started: float, ended: float) -> None:
        """A completed park or restore of one tenant on one GPU."""
        self._records.append(Record(ended, 0, direction, tenant_id, (gpu,), started=started))

    def check(self, max_wait: float | None = None, bound: WaitBound | None = None) -> Report:
        """Replay everything in time order; every broken promise becomes a violation.

        `max_wait` caps every wait alike; `bound` judges each waiter by its queue position."""
        sharing: dict[str, set[str]] = defaultdict(set)
        for record in self._records:
            for gpu in record.gpus if record.kind in ("queued", "granted") else ():
                sharing[gpu].add(record.tenant_id)
        replay = _Replay(max_wait, bound, sharing)
        for record in sorted(self._records, key=lambda r: (r.at, r.order)):
            replay.apply(record)
        return replay.report()


class _Waiting(NamedTuple):
    """A waiter as the replay follows it: when and for what it queued, where the turn log
    stood then, and the tenants holding its GPUs at that moment."""

    at: float
    gpus: tuple[str, ...]
    log_at: int
    holders: frozenset[str]


class _Replay:
    def __init__(
        self, max_wait: float | None, bound: WaitBound | None, sharing: dict[str, set[str]]
    ) -> None:
        self.max_wait = max_wait
        self.bound = bound
        self.sharing = sharing
        self.log: list[tuple[str, str, tuple[str, ...]]] = []  # (kind, tenant, gpus)
        self.granted_at: dict[str, float] = {}  # gpu -> when its holder's turn began
        self.ended_at: dict[str, float] = {}  # gpu -> when its last turn ended
        self.handovers: list[float] = []
        self.violations: list[str] = []
        self.holder: dict[str, tuple[str, str]] = {}  # gpu -> (tenant, lease)
        self.token: dict[str, int] = defaultdict(int)
        self.last_tenant: dict[str, str] = {}
        self.parked: set[tuple[str, str]] = set()  # (tenant, gpu)
        self.queued: dict[str, _Waiting] = {}
        self.turns: dict[str, int] = defaultdict(int)
        self.counts: dict[str, int] = defaultdict(int)
        self.longest = 0.0
        self.first = self.last = 0.0

    def apply(self, r: Record) -> None:
        self.counts[r.kind] += 1
        handler = getattr(self, f"on_{r.kind}", None)
        if handler is not None:
            handler(r)

    def on_park(self, r: Record) -> None:
        gpu = r.gpus[0]
        held = self.holder.get(gpu)
        if held and held[0] == r.tenant_id:
            self.counts["holder_parks"] += 1  # only a revocation may do this; see on_yielded
        self.parked.add((r.tenant_id, gpu))

    def on_restore(self, r: Record) -> None:
        self.parked.discard((r.tenant_id, r.gpus[0]))

    def on_queued(self, r: Record) -> None:
        holders = frozenset(self.holder[g][0] for g in r.gpus if g in self.holder)
        self.queued[r.tenant_id] = _Waiting(r.at, r.gpus, len(self.log), holders - {r.tenant_id})

    def on_granted(self, r: Record) -> None:
        self.turns[r.tenant_id] += 1
        self.first = self.first or r.at
        self.last = r.at
        for gpu in r.gpus:
            if gpu in self.holder:
                other = self.holder[gpu][0]
                self.violations.append(
                    f"{r.at:.3f}: {gpu} granted to {r.tenant_id} while {other} holds it"
                )
            if (r.tenant_id, gpu) in self.parked:
                self.violations.append(
                    f"{r.at:.3f}: {r.tenant_id} granted {gpu} while parked (no restore)"
                )
            token = r.tokens.get(gpu, 0)
            if token <= self.token[gpu]:
                self.violations.append(
                    f"{r.at:.3f}: fencing token {token} on {gpu} after {self.token[gpu]}"
                )
            self.token[gpu] = max(self.token[gpu], token)
            if self.last_tenant.get(gpu, r.tenant_id) != r.tenant_id:
                self.counts["handoffs"] += 1
            self.last_tenant[gpu] = r.tenant_id
            self.holder[gpu] = (r.tenant_id, r.lease_id)
            self.granted_at[gpu] = r.at
            if gpu in self.ended_at:
                self.handovers.append(r.at - self.ended_at.pop(gpu))
        waiting = self.queued.pop(r.tenant_id, None)
        if waiting is not None:
            self._judge_wait(r, waiting)
        self.log.append(("granted", r.tenant_id, r.gpus))

    def _judge_wait(self, r: Record, waiting: _Waiting) -> None:
        waited = r.at - waiting.at
        self.longest = max(self.longest, waited)
        if self.max_wait is not None and waited > self.max_wait:
            self.violations.append(
                f"{r.at:.3f}: {r.tenant_id} waited {waited:.2f} s "
                f"(policy allows {self.max_wait:.2f} s)"
            )
        if self.bound is None:
            return
        mine = set(waiting.gpus)
        during = [(k, t) for k, t, gpus in self.log[waiting.log_at :] if mine & set(gpus)]
        ahead = len(waiting.holders) + sum(k == "granted" for k, _ in during)
        resumed = sum(k == "revoked" for k, _ in during)
        sharing = len(set().union(*(self.sharing[g] for g in mine)) - {r.tenant_id})
        allowed = self.bound.turns_ahead(sharing, resumed)
        if ahead > allowed:
            self.violations.append(
                f"{r.at:.3f}: {r.tenant_id} waited behind {ahead} turns on "
                f"{', '.join(waiting.gpus)}; the policy allows {allowed} ({sharing} tenants "
                f"share them, {resumed} revoked holders resumed)"
            )
        longest = self.bound.longest_wait(ahead)
        if waited > longest:
            self.violations.append(
                f"{r.at:.3f}: {r.tenant_id} waited {waited:.2f} s behind {ahead} turns "
                f"(the bound allows {longest:.2f} s)"
            )

    def on_yielded(self, r: Record) -> None:
        self._end(r)

    def on_revoked(self, r: Record) -> None:
        self.counts["holder_parks_revoked"] += sum((r.tenant_id, g) in self.parked for g in r.gpus)
        self._end(r)
        self.log.append(("revoked", r.tenant_id, r.gpus))

    def on_expired(self, r: Record) -> None:
        self.queued.pop(r.tenant_id, None)

    def on_cancelled(self, r: Record) -> None:
        self.queued.pop(r.tenant_id, None)

    def on_tenant_gone(self, r: Record) -> None:
        self.queued.pop(r.tenant_id, None)
        for gpu, (tenant, _) in list(self.holder.items()):
            if tenant == r.tenant_id:
                del self.holder[gpu]

    def _end(self, r: Record) -> None:
        if self.bound is not None:
            self._judge_hold(r)
        for gpu in r.gpus:
            self.granted_at.pop(gpu, None)
            self.ended_at[gpu] = r.at
            held = self.holder.pop(gpu, None)
            if held != (r.tenant_id, r.lease_id):
                self.violations.append(
                    f"{r.at:.3f}: {r.kind} of {gpu} by {r.tenant_id}, holder was {held}"
                )

    def _judge_hold(self, r: Record) -> None:
        """A turn others waited for ends by the time its maximum hold allows."""
        assert self.bound is not None
        for gpu in r.gpus:
            began = self.granted_at.get(gpu)
            waits = [w.at for t, w in self.queued.items() if t != r.tenant_id and gpu in w.gpus]
            if began is None or not waits:
                continue
            deadline = self.bound.turn_ends_by(began, min(waits))
            if r.at > deadline:
                self.violations.append(
                    f"{r.at:.3f}: {r.tenant_id} held {gpu} {r.at - began:.2f} s while others "
                    f"waited, {r.at - deadline:.2f} s past its maximum hold and a handover"
                )

    def report(self) -> Report:
        if self.counts["holder_parks"] > self.counts["holder_parks_revoked"]:
            self.violations.append(
                f"{self.counts['holder_parks']} parks of a holder, only "
                f"{self.counts['holder_parks_revoked']} of them revoked"
            )
        return Report(
            violations=self.violations,
            turns=dict(self.turns),
            fairness=jain(self.turns.values()),
            grants=self.counts["granted"],
            handoffs=self.counts["handoffs"],
            seconds=self.last - self.first,
            max_wait=self.longest,
            parks=self.counts[PARK],
            restores=self.counts[RESTORE],
            revocations=self.counts["revoked"],
            handovers=self.handovers,
        )
