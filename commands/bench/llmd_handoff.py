"""`baton bench handoff --api llmd`: acquire and yield→grant handoff through llm-d's API.

The agent runs in this process with `--llmd-listen` on loopback; each job is a separate
process speaking llm-d's TimeSliceOrchestratorService over plaintext gRPC (Acquire, Yield), as
llm-d's own client does. The bare relay of `baton bench handoff` runs in the same run as the
reference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from typing import Any

from commands.bench.handoff import _reference, _spawn, handoffs, percentile, too_short
from commands.bench.relay import HOLD_S, WARMUP

GPU = "GPU-bench-0"
GROUP = "bench"


def run_llmd_handoff_bench(iterations: int) -> dict[str, Any]:
    """Both measurements through llm-d's API against a fresh agent, and the relay's."""
    return asyncio.run(_bench(iterations))


async def _bench(iterations: int) -> dict[str, Any]:
    from agent.assembly import AgentConfig, build_agent

    workdir = tempfile.mkdtemp(dir="/tmp", prefix="baton-bench-llmd-")
    config = AgentConfig(
        socket=f"{workdir}/agent.sock",
        state_dir=f"{workdir}/state",
        http_host="127.0.0.1",
        http_port=0,
        llmd_listen="127.0.0.1:0",
        llmd_groups=(f"{GROUP}={GPU}",),
    )
    agent = build_agent(config)
    await agent.start()
    assert agent.llmd is not None
    target = f"127.0.0.1:{agent.llmd.port}"
    try:
        args = ["--target", target, "--iterations", str(iterations)]
        solo = await _spawn(__name__, [[*args, "--mode", "acquire", "--job", "solo"]])
        pair = await _spawn(
            __name__, [[*args, "--mode", "pingpong", "--job", job] for job in ("ping", "pong")]
        )
    finally:
        await agent.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    acquire = [granted - requested for requested, granted, _ in solo[0]]
    gaps = handoffs(_records(pair))
    if not gaps:
        raise RuntimeError(too_short(iterations, "jobs"))
    ref_acquire, ref_turns = await _reference(iterations)
    ref_gaps = handoffs(ref_turns)
    return {
        "api": "llmd",
        "acquire_p50_ms": round(percentile(acquire, 0.5) * 1000, 3),
        "acquire_p99_ms": round(percentile(acquire, 0.99) * 1000, 3),
        "acquire_samples": len(acquire),
        "handoff_p50_ms": round(percentile(gaps, 0.5) * 1000, 3),
        "handoff_p99_ms": round(percentile(gaps, 0.99) * 1000, 3),
        "iterations": iterations,
        "handoff_samples": len(gaps),
        "reference_acquire_p99_ms": round(percentile(ref_acquire, 0.99) * 1000, 3),
        "reference_acquire_samples": len(ref_acquire),
        "reference_handoff_p50_ms": round(percentile(ref_gaps, 0.5) * 1000, 3),
        "reference_handoff_p99_ms": round(percentile(ref_gaps, 0.99) * 1000, 3),
        "reference_handoff_samples": len(ref_gaps),
    }


def _records(jobs: list[Any]) -> list[list[Any]]:
    """Turns of all jobs in grant order, as `handoffs` reads them (the order is the token)."""
    turns = sorted(
        (granted, name, requested, yielded)
        for name, turns in enumerate(jobs)
        for requested, granted, yielded in turns
    )
    return [
        [token, name, requested, granted, yielded]
        for token, (granted, name, requested, yielded) in enumerate(turns)
    ]


def _job(target: str, mode: str, iterations: int, job: str) -> list[Any]:
    import grpc

    from baton._pb import timeslice_orchestrator_pb2 as ts
    from baton._pb import timeslice_orchestrator_pb2_grpc as ts_grpc

    channel = grpc.insecure_channel(target)
    stub = ts_grpc.TimeSliceOrchestratorServiceStub(channel)
    grpc.channel_ready_future(channel).result(timeout=30)
    print("ready", flush=True)
    sys.stdin.readline()
    turns = []
    for _ in range(iterations + WARMUP):
        requested = time.perf_counter()
        stub.Acquire(ts.AcquireRequest(job_id=job, group_id=GROUP), timeout=60)
        granted = time.perf_counter()
        if mode == "pingpong":
            time.sleep(HOLD_S)
        turns.append((requested, granted, time.perf_counter()))
        stub.Yield(ts.YieldRequest(job_id=job, group_id=GROUP), timeout=60)
    channel.close()
    return turns[WARMUP:]


def main() -> None:
    """Entry point of a bench job process."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--mode", choices=["acquire", "pingpong"], required=True)
    parser.add_argument("--iterations", type=int, required=True)
    parser.add_argument("--job", required=True)
    args = parser.parse_args()
    print(json.dumps(_job(args.target, args.mode, args.iterations, args.job)), flush=True)


if __name__ == "__main__":
    main()
