"""A tenant process for the fake-node tests: takes turns, writes and verifies its device memory.

Prints one JSON object per line: {"event": "turn", "i": ...} after each turn's work, "holding"
when it waits inside its first turn for a line on stdin (--hold), "done", or "error".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
import zlib
from collections.abc import Callable
from typing import TypeVar

from agent.client import AgentUnavailable, Baton
from agent.parking.fakegpu import FakeGpuMemory
from baton.contract.names import ENV_GPUS

T = TypeVar("T")


def say(**event):
    print(json.dumps(event), flush=True)


def seed(name: str, i: int) -> int:
    return zlib.crc32(name.encode()) * 1000 + i


def retried(call: Callable[[], T]) -> T:
    """`call`, again while the agent restarts (each try waits for the client to reconnect)."""
    for attempt in range(5):
        try:
            return call()
        except AgentUnavailable:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--mib", type=int, required=True)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--limit-mib", type=int, default=0)
    p.add_argument("--declare", action="store_true", help="declare --mib as gpu-memory")
    p.add_argument("--hold", action="store_true", help="wait for a stdin line in turn 0")
    p.add_argument("--linger", action="store_true", help="after the turns, wait for a line")
    p.add_argument("--pause-after", type=int, default=-1, help="after turn N, wait for a line")
    p.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args()
    gpu = os.environ[ENV_GPUS]
    baton = Baton(
        name=args.name,
        gpu_memory_mib=args.mib if args.declare else 0,
        memory_limit_bytes=args.limit_mib * 1024 * 1024,
    )
    try:
        baton.connect()
        assert baton.tenant is not None
        mem = FakeGpuMemory(baton.tenant.tenant_id, timeout=args.timeout)
        size = args.mib * 1024 * 1024
        for i in range(args.turns):
            lease = retried(lambda: baton.acquire(args.timeout))
            verified = 0
            if i == 0:
                mem.allocate(gpu, args.mib)
            else:
                mem.verify_pattern(gpu, seed(args.name, i - 1))
                verified += size
            mem.write_pattern(gpu, seed(args.name, i))
            if args.hold and i == 0:
                say(event="holding", lease=lease.lease_id)
                sys.stdin.readline()
                mem.verify_pattern(gpu, seed(args.name, i))
                verified += size
            retried(baton.yield_)
            say(event="turn", i=i, tokens=lease.fencing_tokens, verified_bytes=verified)
            if i == args.pause_after:
                sys.stdin.readline()
        say(event="done")
        if args.linger:
            sys.stdin.readline()
        return 0
    except Exception as e:
        traceback.print_exc()
        say(event="error", error=f"{type(e).__name__}: {e}")
        return 1
    finally:
        baton.close()


if __name__ == "__main__":
    sys.exit(main())
