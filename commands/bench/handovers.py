"""Where a handover's idle time goes: from one tenant's yield to the next one's grant.

A handover is a grant to a tenant that asked before the previous holder (another tenant) yielded,
so the device sat idle only for the switch. Its parts, from the tenants' own records and the
agent's move metrics: `moves` (the tenants' callbacks moving tensors), `client` (a callback's
message read → its run started, and its end → its answer written, in the tenant), `transit`
(the agent's time for a move beyond the tenant's read → answer: the socket both ways and the
agent's hand-offs around the call) and `agent` (the rest: the yield and the grant on the wire,
the agent's planning and bookkeeping). A restore a tenant made in `acquire`, as its grant
arrived, has no message: its record reads it when it started and answers it when it finished,
and it adds its moves only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Handover:
    """One switch: the previous holder yielded at `start`, the next one was granted at `end`."""

    start: float
    end: float

    @property
    def idle_s(self) -> float:
        return self.end - self.start


def handovers(reports: Sequence[Mapping[str, Any]], t0: float, t1: float) -> list[Handover]:
    """The handovers granted within [t0, t1], from the tenants' turn records."""
    turns = sorted(
        (t[2], t[1], t[3], i) for i, r in enumerate(reports) for t in r["turns"]
    )  # (granted, requested, yielded, tenant)
    out = []
    previous: tuple[float, int] | None = None
    for granted, requested, yielded, tenant in turns:
        if previous is not None and t0 <= granted <= t1:
            freed, holder = previous
            if holder != tenant and requested <= freed <= granted:
                out.append(Handover(freed, granted))
        previous = (yielded, tenant)
    return out


def parts(
    switches: Sequence[Handover],
    reports: Sequence[Mapping[str, Any]],
    agent_moves: Mapping[str, Mapping[str, float]],
) -> dict[str, float]:
    """Mean milliseconds per handover: idle, and its parts (module docstring)."""
    if not switches:
        return {}
    agent_s = {
        d: m["seconds"] / m["timed"] if m.get("timed") else 0.0 for d, m in agent_moves.items()
    }
    calls = sorted(c for r in reports for c in r.get("callbacks", []))
    # (action, received, started, finished, answered, moved), by when they were read
    sums = {"idle": 0.0, "moves": 0.0, "client": 0.0, "transit": 0.0}
    for switch in switches:
        sums["idle"] += switch.idle_s
        for action, received, started, finished, answered, _ in calls:
            if switch.start <= received and answered <= switch.end:
                sums["moves"] += finished - started
                if received == started and answered == finished:  # made in acquire
                    continue
                sums["client"] += (started - received) + (answered - finished)
                sums["transit"] += max(0.0, agent_s.get(action, 0.0) - (answered - received))
    n = len(switches)
    out = {k: round(v / n * 1000, 2) for k, v in sums.items()}
    out["agent"] = round(out["idle"] - out["moves"] - out["client"] - out["transit"], 2)
    return out


def summary(
    reports: Sequence[Mapping[str, Any]],
    agent_moves: Mapping[str, Mapping[str, float]],
    t0: float,
    t1: float,
) -> dict[str, Any]:
    """The bench's handover fields: how many, idle p50 and mean, and the parts."""
    switches = handovers(reports, t0, t1)
    idle = sorted(s.idle_s for s in switches)
    return {
        "handovers": len(switches),
        "idle_per_handover_p50_ms": round(idle[len(idle) // 2] * 1000, 2) if idle else 0.0,
        "idle_per_handover_ms": parts(switches, [dict(r) for r in reports], agent_moves),
    }
