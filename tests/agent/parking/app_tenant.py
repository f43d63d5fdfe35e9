"""A tenant that parks itself: on_park copies its "device" bytes to host memory and frees them.

Prints JSON lines: "turn" after each turn, "parked" / "restored" from its callbacks, "done".
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading

from agent.client import Baton

printing = threading.Lock()  # the callbacks run on the client's thread, the turns on this one


def say(**event):
    with printing:
        print(json.dumps(event), flush=True)


class Model:
    """Stands in for weights on a GPU that a framework can offload to pinned host memory."""

    def __init__(self, nbytes: int) -> None:
        self.device: bytearray | None = bytearray(random.Random(1).randbytes(nbytes))
        self.host: bytes | None = None
        self.expected = bytes(self.device)

    def on_park(self, gpu: str) -> int:
        assert self.device is not None, "parked twice"
        self.host, self.device = bytes(self.device), None
        say(event="parked", gpu=gpu)
        return len(self.host)

    def on_restore(self, gpu: str) -> int:
        assert self.host is not None, "restored without a park"
        self.device, self.host = bytearray(self.host), None
        say(event="restored", gpu=gpu)
        return len(self.device)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--mib", type=int, required=True)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--pause-after", type=int, default=-1)
    args = p.parse_args()
    model = Model(args.mib * 1024 * 1024)
    baton = Baton(
        name=args.name,
        gpu_memory_mib=args.mib,
        on_park=model.on_park,
        on_restore=model.on_restore,
    )
    try:
        for i in range(args.turns):
            with baton.turn(timeout=30):
                if model.device != model.expected:
                    say(event="error", error="device bytes differ after restore")
                    return 1
            say(event="turn", i=i)
            if i == args.pause_after:
                sys.stdin.readline()
        say(event="done")
        return 0
    finally:
        baton.close()


if __name__ == "__main__":
    sys.exit(main())
