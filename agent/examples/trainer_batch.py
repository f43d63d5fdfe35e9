"""The RL trainer beside batch inference on one GPU: the trainer (a high tier) has "absolute
priority", the batch tenant (a low tier) fills the trainer's gaps and keeps a minimum share.

Start an agent with the fair policy (here on a simulated GPU), then the two tenants:

    baton agent --backend fake --fake-gpus 1x100 --queue-policy fair --tier-grace 0.2 \\
        --socket /tmp/baton/agent.sock --state-dir /tmp/baton/state --http-port 0
    BATON_AGENT_SOCKET=/tmp/baton/agent.sock BATON_GPUS=GPU-fake-0000 \\
        python -m agent.examples.trainer_batch --seconds 10

The trainer takes the GPU at every yield of the batch tenant, or after `--tier-grace` by
revoking it; the batch tenant keeps `--fair-min-share` of the time while both wait. In a
cluster the tiers are the pods' PriorityClasses (`manifests/examples`); here `priority=`.
Phase durations model the work, so it runs anywhere. Prints one JSON summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from agent.client import Baton
from baton.contract.names import AGENT_SOCKET, ENV_AGENT_SOCKET, ENV_GPUS

TRAINER_PRIORITY = 1000
"""The trainer's tier (a PriorityClass value in a cluster); the batch tenant's is 0."""


@dataclass(frozen=True)
class Role:
    """One tenant: its name, tier, duty, seconds per turn and seconds off the GPU after each."""

    name: str
    priority: int
    duty: int
    turn_s: float
    off_s: float


@dataclass
class Record:
    """What one tenant saw: the wait before each turn and the seconds from each grant to its
    yield (a turn revoked meanwhile counts to the yield: the agent's accounting is exact)."""

    waits: list[float] = field(default_factory=list)
    in_turn_s: float = 0.0


TRAINER = Role("trainer", TRAINER_PRIORITY, duty=80, turn_s=0.3, off_s=0.05)
"""Trains on the GPU, then scores rollouts off it briefly: it asks for most of the GPU."""
BATCH = Role("batch", 0, duty=20, turn_s=0.2, off_s=0.0)
"""Batch inference: always has another batch to run."""


def take_turns(baton: Baton, role: Role, until: float, record: Record) -> None:
    """Turns until `until` (monotonic): wait, hold `turn_s` (the modelled work), go off."""
    while time.monotonic() < until:
        asked = time.monotonic()
        baton.acquire(timeout=max(1.0, until - asked + 5.0))
        got = time.monotonic()
        record.waits.append(got - asked)
        time.sleep(role.turn_s)  # the GPU work this example models
        baton.yield_()
        record.in_turn_s += time.monotonic() - got
        if role.off_s:
            time.sleep(role.off_s)  # scoring rollouts, off the GPU


def run(
    socket: str, gpus: list[str], seconds: float, roles: tuple[Role, ...] = (TRAINER, BATCH)
) -> dict[str, Any]:
    """Both tenants for `seconds`, each from its own thread and session; their figures."""
    until = time.monotonic() + seconds
    records = {role.name: Record() for role in roles}
    clients = [
        Baton(socket, gpus, name=role.name, gpu_duty=role.duty, priority=role.priority)
        for role in roles
    ]
    errors: list[BaseException] = []

    def tenant(baton: Baton, role: Role) -> None:
        try:
            take_turns(baton, role, until, records[role.name])
        except BaseException as exc:  # reported by run(), not lost in the thread
            errors.append(exc)

    threads = [
        threading.Thread(target=tenant, args=(c, r), name=r.name, daemon=True)
        for c, r in zip(clients, roles, strict=True)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(seconds + 30.0)
    finally:
        for baton in clients:
            baton.close()
    if errors:
        raise errors[0]
    return {
        role.name: {
            "priority": role.priority,
            "turns": len(records[role.name].waits),
            "in_turn_s": round(records[role.name].in_turn_s, 4),
            "max_wait_s": round(max(records[role.name].waits, default=0.0), 4),
            "waits_s": [round(w, 4) for w in records[role.name].waits],
        }
        for role in roles
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0)
    args = p.parse_args(argv)
    socket = os.environ.get(ENV_AGENT_SOCKET, AGENT_SOCKET)
    gpus = [g for g in os.environ.get(ENV_GPUS, "").split(",") if g]
    figures = run(socket, gpus, args.seconds)
    print(
        json.dumps({n: {k: v for k, v in f.items() if k != "waits_s"} for n, f in figures.items()})
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
