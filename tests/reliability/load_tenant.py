"""A tenant process for the load runs: random GPU and off-GPU phases, data verified every turn.

    python -m tests.reliability.load_tenant --name NAME --mib MIB --seed N

Prints {"ready": true, "pid": ...}, then waits for a line `go END` (END a wall-clock time) and
takes turns until END. Each turn verifies the pattern the previous turn wrote, writes a new one
and works (sleeps) for the GPU phase; between turns it sleeps for the off-GPU phase. At the end
it prints {"turns": ..., "verified": ..., "errors": [...]} and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import zlib

from agent.client import Baton, BatonError
from agent.parking.fakegpu import FakeGpuMemory, NotResident, PatternMismatch
from baton.contract.names import ENV_GPUS


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def pattern_seed(name: str, turn: int) -> int:
    return zlib.crc32(name.encode()) * 100_000 + turn


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--mib", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpu-ms", default="5,40", help="GPU phase range, ms")
    p.add_argument("--off-ms", default="5,60", help="off-GPU phase range, ms")
    p.add_argument("--acquire-timeout", type=float, default=60.0)
    args = p.parse_args()
    rng = random.Random(args.seed)
    gpu_lo, gpu_hi = (int(x) for x in args.gpu_ms.split(","))
    off_lo, off_hi = (int(x) for x in args.off_ms.split(","))
    gpu = os.environ[ENV_GPUS]
    baton = Baton(name=args.name, gpu_memory_mib=args.mib)
    baton.connect()
    assert baton.tenant is not None
    mem = FakeGpuMemory(baton.tenant.tenant_id, timeout=30)
    say(ready=True, pid=os.getpid())
    end = float(sys.stdin.readline().split()[1])
    turns = verified = 0
    errors: list[str] = []
    while time.time() < end and len(errors) < 5:
        try:
            with baton.turn(timeout=args.acquire_timeout):
                if turns == 0:
                    mem.allocate(gpu, args.mib)
                else:
                    mem.verify_pattern(gpu, pattern_seed(args.name, turns - 1))
                    verified += 1
                mem.write_pattern(gpu, pattern_seed(args.name, turns))
                turns += 1
                time.sleep(rng.uniform(gpu_lo, gpu_hi) / 1000)  # the turn's GPU work
        except (BatonError, NotResident, PatternMismatch) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        time.sleep(rng.uniform(off_lo, off_hi) / 1000)  # scoring, environment steps, ...
    say(turns=turns, verified=verified, errors=errors)
    baton.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
