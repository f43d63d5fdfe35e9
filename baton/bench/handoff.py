"""`baton bench handoff`: acquire latency and yield→grant handoff over the real socket.

The agent runs in this process; tenants are separate processes using the real client. Times
come from `time.perf_counter` (CLOCK_MONOTONIC, shared by all processes on the machine).
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

from agent.client.links import TRANSPORTS
from baton.bench.relay import HOLD_S, WARMUP

GPU = "GPU-bench-0"


def percentile(samples: list[float], q: float) -> float:
    """The q-quantile (0..1) of the samples, nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def handoffs(records: list[list[Any]]) -> list[float]:
    """Yield→grant gaps (s) from `[token, tenant, requested, granted, yielded]` records.

    A gap counts only when the turn passed to the other tenant and its request was already
    queued when the holder yielded.
    """
    by_token = {int(r[0]): r for r in records}
    gaps = []
    for token, (_, tenant, requested, granted, _) in sorted(by_token.items()):
        previous = by_token.get(token - 1)
        if previous is None or previous[1] == tenant or requested > previous[4]:
            continue
        gaps.append(granted - previous[4])
    return gaps


CLIENTS = ("blocking", "async")
"""`Baton` (a caller's thread, the client's event loop in another) or `AsyncBaton`."""


def run_handoff_bench(
    iterations: int, client: str = "blocking", transport: str = "direct", queue_policy: str = "fifo"
) -> dict[str, Any]:
    """Run both measurements against a fresh agent; returns the bench's JSON fields."""
    if client not in CLIENTS:
        raise ValueError(f"client {client!r} is not one of {', '.join(CLIENTS)}")
    if transport not in TRANSPORTS:
        raise ValueError(f"transport {transport!r} is not one of {', '.join(TRANSPORTS)}")
    if client == "blocking" and transport != "direct":
        raise ValueError("the blocking client speaks direct sessions only; use --client async")
    return asyncio.run(_bench(iterations, client, transport, queue_policy))


async def _bench(iterations: int, client: str, transport: str, policy: str) -> dict[str, Any]:
    from agent.assembly import AgentConfig, build_agent

    workdir = tempfile.mkdtemp(dir="/tmp", prefix="baton-bench-")
    socket = f"{workdir}/agent.sock"
    config = AgentConfig(
        socket=socket,
        state_dir=f"{workdir}/state",
        http_host="127.0.0.1",
        http_port=0,
        queue_policy=policy,
    )
    agent = build_agent(config)
    await agent.start()
    try:
        solo = await _workers(socket, "acquire", iterations, ["solo"], client, transport)
        acquire = list(solo[0])
        pair = await _workers(socket, "pingpong", iterations, ["ping", "pong"], client, transport)
        gaps = handoffs(pair[0] + pair[1])
    finally:
        await agent.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    if not gaps:
        raise RuntimeError("no handoffs observed; the tenants never waited for each other")
    ref_acquire, ref_gaps = await _reference(iterations)
    return {
        "acquire_p50_ms": round(percentile(acquire, 0.5) * 1000, 3),
        "acquire_p99_ms": round(percentile(acquire, 0.99) * 1000, 3),
        "handoff_p50_ms": round(percentile(gaps, 0.5) * 1000, 3),
        "handoff_p99_ms": round(percentile(gaps, 0.99) * 1000, 3),
        "iterations": iterations,
        "handoff_samples": len(gaps),
        "client": client,
        "transport": transport,
        "reference_acquire_p99_ms": round(percentile(ref_acquire, 0.99) * 1000, 3),
        "reference_handoff_p50_ms": round(percentile(ref_gaps, 0.5) * 1000, 3),
        "reference_handoff_p99_ms": round(percentile(ref_gaps, 0.99) * 1000, 3),
    }


async def _reference(iterations: int) -> tuple[list[float], list[float]]:
    """The same two measurements against `baton.bench.relay`'s bare relay."""
    from baton.bench.relay import Relay

    workdir = tempfile.mkdtemp(dir="/tmp", prefix="baton-bench-ref-")
    path = f"{workdir}/relay.sock"
    server = await asyncio.start_unix_server(Relay().serve, path=path)
    try:
        args = ["--socket", path, "--iterations", str(iterations)]
        solo = await _spawn("baton.bench.relay", [[*args, "--mode", "acquire"]])
        pair = await _spawn("baton.bench.relay", [[*args, "--mode", "pingpong"]] * 2)
    finally:
        server.close()
        shutil.rmtree(workdir, ignore_errors=True)
    acquire = [granted - requested for requested, granted, _ in solo[0]]
    turns = sorted(
        (granted, name, requested, yielded)
        for name, tenant in enumerate(pair)
        for requested, granted, yielded in tenant
    )
    records = [
        [token, name, requested, granted, yielded]
        for token, (granted, name, requested, yielded) in enumerate(turns)
    ]
    return acquire, handoffs(records)


async def _workers(
    socket: str, mode: str, iterations: int, names: list[str], client: str, transport: str
) -> list[Any]:
    common = ["--socket", socket, "--mode", mode, "--iterations", str(iterations)]
    options = ["--client", client, "--transport", transport]
    return await _spawn(
        "baton.bench.handoff", [[*common, "--name", name, *options] for name in names]
    )


async def _spawn(module: str, argvs: list[list[str]]) -> list[Any]:
    """Run one tenant process per argv; start them together; their last lines, parsed."""
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for argv in argvs
    ]
    for proc in procs:  # each says "ready" once connected; then all start together
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        if line.strip() != b"ready":
            raise RuntimeError(f"bench tenant failed to start: {line!r}")
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
    results = []
    for proc in procs:
        out, _ = await asyncio.wait_for(proc.communicate(), 300)
        if proc.returncode != 0:
            raise RuntimeError(f"bench tenant exited with {proc.returncode}")
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    return results


Turn = tuple[int, float, float, float]
"""`(fencing token, requested, granted, yielded)` of one turn, times from `perf_counter`."""


def _samples(mode: str, name: str, turns: list[Turn]) -> list[Any]:
    """What a tenant process reports, warm-up dropped: acquire latencies, or handoff records."""
    measured = turns[WARMUP:]
    if mode == "acquire":
        return [granted - requested for _, requested, granted, _ in measured]
    return [
        [token, name, requested, granted, yielded]
        for token, requested, granted, yielded in measured
    ]


def _tenant(socket: str, mode: str, iterations: int, name: str, transport: str) -> list[Any]:
    from agent.client import Baton

    if transport != "direct":
        raise SystemExit("the blocking client speaks direct sessions only; use --client async")
    baton = Baton(socket, [GPU], name=name)
    baton.connect()
    print("ready", flush=True)
    sys.stdin.readline()
    turns: list[Turn] = []
    for _ in range(iterations + WARMUP):
        requested = time.perf_counter()
        lease = baton.acquire()
        granted = time.perf_counter()
        if mode == "pingpong":
            time.sleep(HOLD_S)
        turns.append((lease.fencing_tokens[GPU], requested, granted, time.perf_counter()))
        baton.yield_()
    baton.close()
    return _samples(mode, name, turns)


async def _async_tenant(
    socket: str, mode: str, iterations: int, name: str, transport: str
) -> list[Any]:
    from agent.client import AsyncBaton

    baton = AsyncBaton(socket, [GPU], name=name, transport=transport)
    await baton.connect()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    turns: list[Turn] = []
    for _ in range(iterations + WARMUP):
        requested = time.perf_counter()
        lease = await baton.acquire()
        granted = time.perf_counter()
        if mode == "pingpong":
            await asyncio.sleep(HOLD_S)
        turns.append((lease.fencing_tokens[GPU], requested, granted, time.perf_counter()))
        await baton.yield_()
    await baton.close()
    return _samples(mode, name, turns)


def main() -> None:
    """Entry point of a bench tenant process."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--mode", choices=["acquire", "pingpong"], required=True)
    parser.add_argument("--iterations", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--client", choices=CLIENTS, default="blocking")
    parser.add_argument("--transport", choices=TRANSPORTS, default="direct")
    args = parser.parse_args()
    tenant_args = (args.socket, args.mode, args.iterations, args.name, args.transport)
    if args.client == "async":
        run = asyncio.run(_async_tenant(*tenant_args))
    else:
        run = _tenant(*tenant_args)
    print(json.dumps(run), flush=True)


if __name__ == "__main__":
    main()
