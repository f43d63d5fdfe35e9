"""A tenant process of `baton bench handoff`: takes its turns through the real client.

Each turn is timed from this process's clock (`time.perf_counter`, CLOCK_MONOTONIC, shared by
every process on the machine): asked, granted, and yielding (taken just before `yield_`). With
a parking backend the tenant holds memory the way that backend sees it: `fake`, a simulated
region allocated in its first turn; `app`, park/restore callbacks that report its bytes (a small
model's worth, moved by nothing: the agent's side of the handover is what is measured); `cuda`,
a tensor on the GPU allocated in its first turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from agent.client.links import TRANSPORTS
from agent.parking.methods import APP, CUDA, FAKE, NONE
from baton.contract.names import MIB
from commands.bench.relay import WARMUP

CLIENTS = ("blocking", "async")
"""`Baton` (a caller's thread, the client's session in another) or `AsyncBaton`."""

Turn = tuple[int, float, float, float]
"""`(fencing token, requested, granted, yielded)` of one turn, times from `perf_counter`."""


class Memory:
    """What the tenant holds on its GPU, as its backend sees it."""

    def __init__(self, backend: str, name: str, gpu: str, mib: int, fake_dir: str) -> None:
        self.backend, self.name, self.gpu, self.mib, self.fake_dir = (
            backend, name, gpu, mib, fake_dir,
        )  # fmt: skip
        self._held: Any = None

    def options(self) -> dict[str, Any]:
        """The client's registration options: its declared memory and, for `app`, callbacks."""
        if self.backend == NONE:
            return {}
        options: dict[str, Any] = {"gpu_memory_mib": self.mib}
        if self.backend == APP:
            options |= {"on_park": self._moved, "on_restore": self._moved}
        return options

    def _moved(self, gpu: str) -> int:
        return self.mib * MIB

    def allocate(self) -> None:
        """In its first turn: take its memory on the GPU."""
        if self._held is not None:
            return
        if self.backend == FAKE:
            from agent.parking.fakegpu import FakeGpuMemory

            self._held = FakeGpuMemory(self.name, self.fake_dir)
            self._held.allocate(self.gpu, self.mib)
        elif self.backend == CUDA:
            import torch

            self._held = torch.empty(self.mib * MIB, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
        else:
            self._held = True


def _samples(mode: str, name: str, turns: list[Turn]) -> list[Any]:
    """What a tenant process reports, warm-up dropped: acquire latencies, or turn records."""
    measured = turns[WARMUP:]
    if mode == "acquire":
        return [granted - requested for _, requested, granted, _ in measured]
    return [
        [token, name, requested, granted, yielded]
        for token, requested, granted, yielded in measured
    ]


def _tenant(args: argparse.Namespace, memory: Memory) -> list[Any]:
    from agent.client import Baton

    if args.transport != "direct":
        raise SystemExit("the blocking client speaks direct sessions only; use --client async")
    baton = Baton(args.socket, [args.gpu], name=args.name, **memory.options())
    baton.connect()
    print("ready", flush=True)
    sys.stdin.readline()
    turns: list[Turn] = []
    hold = args.hold_ms / 1000
    for _ in range(args.iterations + WARMUP):
        requested = time.perf_counter()
        lease = baton.acquire()
        granted = time.perf_counter()
        memory.allocate()
        if args.mode == "pingpong":
            time.sleep(hold)
        turns.append((lease.fencing_tokens[args.gpu], requested, granted, time.perf_counter()))
        baton.yield_()
    baton.close()
    return _samples(args.mode, args.name, turns)


async def _async_tenant(args: argparse.Namespace, memory: Memory) -> list[Any]:
    from agent.client import AsyncBaton

    options = memory.options()
    baton = AsyncBaton(args.socket, [args.gpu], name=args.name, transport=args.transport, **options)
    await baton.connect()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    turns: list[Turn] = []
    hold = args.hold_ms / 1000
    for _ in range(args.iterations + WARMUP):
        requested = time.perf_counter()
        lease = await baton.acquire()
        granted = time.perf_counter()
        memory.allocate()
        if args.mode == "pingpong":
            await asyncio.sleep(hold)
        turns.append((lease.fencing_tokens[args.gpu], requested, granted, time.perf_counter()))
        await baton.yield_()
    await baton.close()
    return _samples(args.mode, args.name, turns)


def main() -> None:
    """Entry point of a bench tenant process."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--mode", choices=["acquire", "pingpong"], required=True)
    parser.add_argument("--iterations", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--gpu", required=True)
    parser.add_argument("--client", choices=CLIENTS, default="blocking")
    parser.add_argument("--transport", choices=TRANSPORTS, default="direct")
    parser.add_argument("--hold-ms", type=float, default=2.0)
    parser.add_argument("--backend", default=NONE)
    parser.add_argument("--mib", type=int, default=0)
    parser.add_argument("--fake-dir", default="")
    args = parser.parse_args()
    memory = Memory(args.backend, args.name, args.gpu, args.mib, args.fake_dir)
    if args.client == "async":
        run = asyncio.run(_async_tenant(args, memory))
    else:
        run = _tenant(args, memory)
    print(json.dumps(run), flush=True)


if __name__ == "__main__":
    main()
