"""A PyTorch tenant for hack/gpu-check.sh: takes turns on one real GPU through `baton agent`.

It fills --gib GiB of device memory from a seeded generator, and at the start of every later turn
checks the tensors are bit-identical to what it wrote (after a park/restore by the agent's cuda
backend), and that NVML no longer lists its peer, which the agent parked to make room. Each turn
is held --hold seconds. An acquire or yield cut off by an agent restart is made again once the
client has reconnected.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import pynvml
import torch

from agent.client import Baton
from agent.client.errors import AgentUnavailable, NotHolding

CHUNK = 1 << 30


def fill(chunks: list[torch.Tensor], seed: int) -> None:
    """Overwrite every chunk with the stream of `seed`."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for chunk in chunks:
        chunk.random_(0, 256, generator=gen)


def identical(chunks: list[torch.Tensor], seed: int) -> bool:
    """Whether the chunks still hold exactly the stream of `seed`."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for chunk in chunks:
        want = torch.empty_like(chunk).random_(0, 256, generator=gen)
        if not torch.equal(chunk, want):
            return False
    return True


def listed_pids(gpu: str) -> set[int]:
    """PIDs NVML lists as compute processes on the GPU."""
    handle = pynvml.nvmlDeviceGetHandleByUUID(gpu)
    return {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}


def alive(pid: int) -> bool:
    """Whether the process still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def acquire(baton: Baton, timeout: float) -> None:
    """Take the turn, asking again if an agent restart cut the request off."""
    for _ in range(5):
        try:
            baton.acquire(timeout=timeout)
            return
        except AgentUnavailable:
            continue
    raise SystemExit("the agent stayed unavailable across five acquires")


def release(baton: Baton) -> None:
    """Yield the turn; a turn the restarted agent no longer knows is already given up."""
    for _ in range(5):
        try:
            baton.yield_()
            return
        except AgentUnavailable:
            continue
        except NotHolding:
            return
    raise SystemExit("the agent stayed unavailable across five yields")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--peer", required=True)
    p.add_argument("--gpu", required=True, help="GPU UUID")
    p.add_argument("--gib", type=int, default=4)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--hold", type=float, default=0.0, help="seconds each turn is held")
    p.add_argument("--workdir", required=True)
    args = p.parse_args()
    work = Path(args.workdir)
    pynvml.nvmlInit()
    baton = Baton(gpus=[args.gpu], name=args.name, gpu_memory_mib=args.gib * 1024 + 1024)
    turns: list[dict[str, object]] = []
    try:
        for turn in range(args.turns):
            asked = time.monotonic()
            acquire(baton, 600)
            try:
                waited = time.monotonic() - asked
                if turn == 0:
                    chunks = [
                        torch.empty(CHUNK, dtype=torch.uint8, device="cuda")
                        for _ in range(args.gib)
                    ]
                    (work / f"{args.name}.pid").write_text(str(os.getpid()))
                elif not identical(chunks, turn - 1):
                    raise SystemExit(f"{args.name}: tensors differ after restore (turn {turn})")
                peer_parked = None
                peer = work / f"{args.peer}.pid"
                if peer.exists() and alive(int(peer.read_text())):
                    peer_parked = int(peer.read_text()) not in listed_pids(args.gpu)
                    if not peer_parked:
                        raise SystemExit(f"{args.name}: NVML still lists {args.peer} on the GPU")
                fill(chunks, turn)
                torch.cuda.synchronize()
                time.sleep(args.hold)
                turns.append({"turn": turn, "waited_s": round(waited, 3), "peer": peer_parked})
            finally:
                release(baton)
        print(json.dumps({"tenant": args.name, "turns": turns}), flush=True)
        return 0
    finally:
        baton.close()


if __name__ == "__main__":
    sys.exit(main())
