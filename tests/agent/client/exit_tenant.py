"""A tenant that takes one turn and leaves at once, while the agent may be parking it.

    python tests/agent/client/exit_tenant.py NAME JITTER_MS close|exit

Its on_park hashes 16 MiB (a few milliseconds of work, as a framework's offload takes) and
prints "parking" before and "parked" after; `exit` leaves the client for the interpreter's exit
to close, `close` closes it first. Busy-waits JITTER_MS after its turn, so that the agent's park
lands at a different point of its exit each run.
"""

from __future__ import annotations

import hashlib
import sys
import time

from agent.client import Baton

PARK_BYTES = bytes(16 * 1024 * 1024)
"""What a park hashes: tens of milliseconds of work that releases the GIL, as a copy does."""


def park(gpu: str) -> int:
    print("parking", flush=True)
    hashlib.sha256(PARK_BYTES).hexdigest()
    print("parked", flush=True)
    return len(PARK_BYTES)


def main() -> int:
    name, jitter_ms, how = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    baton = Baton(  # the park comes by callback, racing the exit (not at the yield)
        name=name, gpu_memory_mib=60, on_park=park, on_restore=lambda gpu: 0, park_at_yield=False
    )
    with baton.turn(timeout=60):
        pass
    end = time.perf_counter() + jitter_ms / 1000
    while time.perf_counter() < end:
        pass
    if how == "close":
        baton.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
