"""The handoff bench's reference: the same turn-taking with nothing of Baton in it.

A relay in the bench process grants one turn at a time, first come first served, over a unix
socket with the same frames as a direct session, to tenant processes that wait in the calling
thread; it does no bookkeeping, no metrics, no state. What the handoff bench measures above this
floor is Baton's own cost; the floor itself is the machine (scheduling of three processes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from collections import deque
from typing import Any

from baton.contract import framing

WARMUP = 20
"""Turns left out of every measurement (the handoff bench's and the relay's)."""
HOLD_S = 0.002
"""How long each tenant holds its turn in the handoff run by default (`--hold-ms`), so the
others are queued by then."""

ACQUIRE, YIELD, GRANTED, DONE = b"A", b"Y", b"G", b"K"


class Relay:
    """One GPU's turns: a holder and a FIFO queue of writers."""

    def __init__(self) -> None:
        self.holder: asyncio.StreamWriter | None = None
        self.queue: deque[asyncio.StreamWriter] = deque()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (body := await framing.read_body(reader)) is not None:
                if body == ACQUIRE:
                    if self.holder is None:
                        self.holder = writer
                        writer.write(framing.frame(GRANTED))
                    else:
                        self.queue.append(writer)
                elif body == YIELD and self.holder is writer:
                    self.holder = self.queue.popleft() if self.queue else None
                    if self.holder is not None:
                        self.holder.write(framing.frame(GRANTED))
                    writer.write(framing.frame(DONE))
        except (framing.FrameError, OSError):
            pass
        finally:
            writer.close()


class _Tenant:
    """The tenant side: blocking socket, answers read in the calling thread."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(60)
        self.sock.connect(path)
        self.reader = framing.BlockingReader(self.sock)

    def call(self, body: bytes) -> bytes:
        self.sock.sendall(framing.frame(body))
        answer = self.reader.read_body()
        if answer is None:
            raise ConnectionError("the relay closed the connection")
        return answer


def tenant_turns(path: str, mode: str, iterations: int, hold_s: float) -> list[Any]:
    """Run one tenant's turns; returns `[token, requested, granted, yielded]` per turn."""
    tenant = _Tenant(path)
    print("ready", flush=True)
    sys.stdin.readline()
    turns = []
    for _ in range(iterations + WARMUP):
        requested = time.perf_counter()
        tenant.call(ACQUIRE)
        granted = time.perf_counter()
        if mode == "pingpong":
            time.sleep(hold_s)
        yielded = time.perf_counter()
        tenant.call(YIELD)
        turns.append((requested, granted, yielded))
    return turns[WARMUP:]


def main() -> None:
    """Entry point of a reference tenant process."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--mode", choices=["acquire", "pingpong"], required=True)
    parser.add_argument("--iterations", type=int, required=True)
    parser.add_argument("--hold-ms", type=float, default=HOLD_S * 1000)
    args = parser.parse_args()
    turns = tenant_turns(args.socket, args.mode, args.iterations, args.hold_ms / 1000)
    print(json.dumps(turns), flush=True)


if __name__ == "__main__":
    main()
