"""Invariants of a run, read from the agent's event stream and the backend's moves. Pure.

Feed `event()` with the agent's events (WatchEvents) and `move()` with completed parks and
restores, in any order; `check()` replays them in time order and returns the violations and
the figures (turns per tenant, Jain's fairness index, handoffs per second, longest wait).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

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
            "violations": len(self.violations),
        }


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

    def check(self, max_wait: float) -> Report:
        """Replay everything in time order; every broken promise becomes a violation."""
        replay = _Replay(max_wait)
        for record in sorted(self._records, key=lambda r: (r.at, r.order)):
            replay.apply(record)
        return replay.report()


class _Replay:
    def __init__(self, max_wait: float) -> None:
        self.max_wait = max_wait
        self.violations: list[str] = []
        self.holder: dict[str, tuple[str, str]] = {}  # gpu -> (tenant, lease)
        self.token: dict[str, int] = defaultdict(int)
        self.last_tenant: dict[str, str] = {}
        self.parked: set[tuple[str, str]] = set()  # (tenant, gpu)
        self.queued: dict[str, float] = {}
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
        self.queued[r.tenant_id] = r.at

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
        since = self.queued.pop(r.tenant_id, None)
        if since is not None:
            waited = r.at - since
            self.longest = max(self.longest, waited)
            if waited > self.max_wait:
                self.violations.append(
                    f"{r.at:.3f}: {r.tenant_id} waited {waited:.2f} s "
                    f"(policy allows {self.max_wait:.2f} s)"
                )

    def on_yielded(self, r: Record) -> None:
        self._end(r)

    def on_revoked(self, r: Record) -> None:
        self.counts["holder_parks_revoked"] += sum((r.tenant_id, g) in self.parked for g in r.gpus)
        self._end(r)

    def on_expired(self, r: Record) -> None:
        self.queued.pop(r.tenant_id, None)

    def on_tenant_gone(self, r: Record) -> None:
        self.queued.pop(r.tenant_id, None)
        for gpu, (tenant, _) in list(self.holder.items()):
            if tenant == r.tenant_id:
                del self.holder[gpu]

    def _end(self, r: Record) -> None:
        for gpu in r.gpus:
            held = self.holder.pop(gpu, None)
            if held != (r.tenant_id, r.lease_id):
                self.violations.append(
                    f"{r.at:.3f}: {r.kind} of {gpu} by {r.tenant_id}, holder was {held}"
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
        )
