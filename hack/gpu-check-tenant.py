"""A tenant for hack/gpu-check.sh: takes turns on one GPU through `baton agent --backend cuda`.

It opens its session first and makes its CUDA context at its first turn, as a PyTorch trainer
does. It fills --gib GiB of device memory from a seeded generator, and at the start of every
later turn checks the memory is bit-identical to what it wrote (after a park/restore by the
agent's cuda backend), and that NVML no longer lists its peer, which the agent parked to make
room. Each turn is held --hold seconds. An acquire or yield cut off by an agent restart is made
again once the client has reconnected. With --stand-in (the dry run, no GPU) the "device
memory" is a host buffer and the context is the stand-in driver's state file for this process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pynvml

from agent.client import Baton
from agent.client.errors import AgentUnavailable, NotHolding

CHUNK = 1 << 30


class CudaMemory:
    """GIB GiB of real device memory, filled and checked on the GPU."""

    def __init__(self, gib: int) -> None:
        import torch

        self.torch = torch
        self.chunks = [torch.empty(CHUNK, dtype=torch.uint8, device="cuda") for _ in range(gib)]

    def close(self) -> None:
        self.chunks.clear()

    def fill(self, seed: int) -> None:
        gen = self.torch.Generator(device="cuda").manual_seed(seed)
        for chunk in self.chunks:
            chunk.random_(0, 256, generator=gen)
        self.torch.cuda.synchronize()

    def identical(self, seed: int) -> bool:
        gen = self.torch.Generator(device="cuda").manual_seed(seed)
        for chunk in self.chunks:
            want = self.torch.empty_like(chunk).random_(0, 256, generator=gen)
            if not self.torch.equal(chunk, want):
                return False
        return True


class StandInMemory:
    """The dry run's memory: the stand-in driver learns of this process's context and bytes from
    files (hack/gpu-check/standins); the bytes checked are a small host buffer. A helper process
    beside it only calls cuInit (NVML lists it with 0 bytes; its lock answers "not
    initialized"), as a data loader worker may."""

    def __init__(self, gib: int) -> None:
        state = Path(os.environ["FAKE_GPU_STATE"])
        (state / f"{os.getpid()}.bytes").write_text(str(gib * CHUNK))
        (state / f"{os.getpid()}.state").write_text("0\n")
        self.helper = subprocess.Popen(["sleep", "600"])
        (state / f"{self.helper.pid}.cuinit").write_text("")
        self.data = b""

    def close(self) -> None:
        self.helper.kill()
        self.helper.wait(10)

    def fill(self, seed: int) -> None:
        self.data = seed.to_bytes(8, "little") * 4096

    def identical(self, seed: int) -> bool:
        return self.data == seed.to_bytes(8, "little") * 4096


def listed_pids(gpu: str) -> set[int]:
    """PIDs NVML lists as compute processes on the GPU."""
    handle = pynvml.nvmlDeviceGetHandleByUUID(gpu)
    return {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}


def used_mib(gpu: str) -> int:
    """MiB in use on the GPU as NVML reports it."""
    return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByUUID(gpu)).used) >> 20


def alive(pid: int) -> bool:
    """Whether the process still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def retried(call: Any, what: str) -> None:
    """`call()`, again if an agent restart cut it off; a yield the new agent does not know of
    is already done."""
    for _ in range(5):
        try:
            call()
            return
        except AgentUnavailable:
            continue
        except NotHolding:
            return
    raise SystemExit(f"the agent stayed unavailable across five {what}s")


def peer_parked(work: Path, peer: str, gpu: str, me: str) -> bool | None:
    """Whether NVML no longer lists the live peer (None: no live peer yet); exits if it does."""
    pid_file = work / f"{peer}.pid"
    if not pid_file.exists() or not alive(int(pid_file.read_text())):
        return None
    if int(pid_file.read_text()) in listed_pids(gpu):
        raise SystemExit(f"{me}: NVML still lists {peer} on the GPU")
    return True


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--peer", required=True)
    p.add_argument("--gpu", required=True, help="GPU UUID")
    p.add_argument("--gib", type=int, default=4)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--hold", type=float, default=0.0, help="seconds each turn is held")
    p.add_argument("--workdir", required=True)
    p.add_argument("--stand-in", action="store_true", help="the dry run: no GPU")
    args = p.parse_args()
    work = Path(args.workdir)
    pynvml.nvmlInit()
    baton = Baton(gpus=[args.gpu], name=args.name, gpu_memory_mib=args.gib * 1024 + 1024)
    turns: list[dict[str, object]] = []
    memory: CudaMemory | StandInMemory | None = None
    try:
        for turn in range(args.turns):
            asked = time.monotonic()
            retried(lambda: baton.acquire(timeout=240), "acquire")
            try:
                started, waited = time.time(), round(time.monotonic() - asked, 3)
                if memory is None:  # the CUDA context comes now, after the session opened
                    memory = StandInMemory(args.gib) if args.stand_in else CudaMemory(args.gib)
                    (work / f"{args.name}.pid").write_text(str(os.getpid()))
                elif not memory.identical(turn - 1):
                    raise SystemExit(f"{args.name}: memory differs after restore (turn {turn})")
                peer = peer_parked(work, args.peer, args.gpu, args.name)
                memory.fill(turn)
                time.sleep(args.hold)
                turns.append({
                    "turn": turn, "at": started, "waited_s": waited, "peer": peer,
                    "gpu_used_mib": used_mib(args.gpu),
                })  # fmt: skip
            finally:
                retried(baton.yield_, "yield")
        print(json.dumps({"tenant": args.name, "turns": turns}), flush=True)
        return 0
    finally:
        if memory is not None:
            memory.close()
        baton.close()


if __name__ == "__main__":
    sys.exit(main())
