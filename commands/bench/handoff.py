"""`baton bench handoff`: acquire latency and yield→grant handoff over the real socket.

The agent runs in this process with the parking backend asked for (`--backend`); tenants are
separate processes using the real client (`commands.bench.handoff_tenant`), each holding its turn
for `--hold-ms` and asking again at once. The same run measures the references: the bare relay
(`commands.bench.relay`, the machine's floor) and, beside a parking backend, the agent with none.
A handoff is timed from the tenants' clocks: the yielder's just before it yields → the next
holder's just after its grant. The idle share is the part of the run the GPU was held by nobody
while a tenant waited for it.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import sys
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any

from agent.client.links import TRANSPORTS
from agent.parking.methods import APP, CUDA, FAKE, NONE, PLAIN
from agent.parking.setup import ParkingOptions
from baton.contract.names import fake_gpu_uuid
from commands.bench.handoff_tenant import CLIENTS
from commands.bench.relay import HOLD_S, WARMUP

GPU = fake_gpu_uuid(0)
GPU_MIB = 1024
"""The simulated GPU the parking backends manage (`fake`, `app`)."""
BACKENDS = PLAIN
"""The parking methods a bench tenant can be parked by (`agent.parking.methods`)."""
TENANT = "commands.bench.handoff_tenant"
MAX_TENANTS = 64
"""The most tenants a run takes: each is a process of its own, and past a few dozen on a
machine's cores the handoff measured is its process scheduler's more than the agent's."""
MAX_HOLD_MS = 500.0
"""The longest turn a tenant holds: behind 63 others a tenant waits at most ~32 s for its turn,
within the relay tenants' 60-s wait for an answer and the agent's 60-s longest turn."""
TENANT_WAIT_S = 600.0
"""How long tenant processes get to finish, beyond the time their turns spend held."""


def percentile(samples: list[float], q: float) -> float:
    """The q-quantile (0..1) of the samples, nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def handoffs(records: list[list[Any]]) -> list[float]:
    """Yield→grant gaps (s) from `[token, tenant, requested, granted, yielded]` records.

    A gap counts only when the turn passed to another tenant and its request was already
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


def idle_share(records: list[list[Any]]) -> float:
    """Of the time from the first measured grant to the last yield, the share in handoff gaps:
    the GPU held by nobody while a tenant waited."""
    if not records:
        return 0.0
    span = max(r[4] for r in records) - min(r[3] for r in records)
    return sum(handoffs(records)) / span if span > 0 else 0.0


@dataclass
class Setup:
    """One bench: the agent's backend, the tenants and their turns."""

    iterations: int
    client: str = "blocking"
    transport: str = "direct"
    queue_policy: str = "fifo"
    backend: str = NONE
    hold_ms: float = HOLD_S * 1000
    tenants: int = 2
    swap: bool = False
    """Tenants' memory does not fit together: every handoff parks the leaver, restores the next."""
    gpu: str = GPU
    """The GPU the tenants share: the simulated one, or with `cuda` the first real one."""
    rounds: int = 3
    """Each row runs this many times (at least 50 iterations each), the rows taking turns."""

    def check(self) -> None:
        """Refuse what cannot run, with the option to change."""
        if self.client not in CLIENTS:
            raise ValueError(f"client {self.client!r} is not one of {', '.join(CLIENTS)}")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport {self.transport!r} is not one of {', '.join(TRANSPORTS)}")
        if self.client == "blocking" and self.transport != "direct":
            raise ValueError("the blocking client speaks direct sessions only; use --client async")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.tenants < 2:
            raise ValueError(f"tenants {self.tenants} is too few: a handoff needs 2 or more")
        if self.tenants > MAX_TENANTS:
            raise ValueError(
                f"tenants {self.tenants} is too many: at most {MAX_TENANTS}, each a process of "
                "its own taking turns on one GPU"
            )
        if self.hold_ms < 0:
            raise ValueError(f"hold-ms {self.hold_ms:g} is negative")
        if not math.isfinite(self.hold_ms):
            raise ValueError(f"hold-ms {self.hold_ms:g} is not a number of milliseconds")
        if self.hold_ms > MAX_HOLD_MS:
            raise ValueError(
                f"hold-ms {self.hold_ms:g} is too long: at most {MAX_HOLD_MS:g} ms a turn, so "
                "that a tenant waiting behind the others gets its turn within the bench's waits"
            )
        if self.swap and self.backend not in (FAKE, APP):
            raise ValueError(f"swap runs on the simulated GPU: use --backend {FAKE} or {APP}")

    @property
    def mib(self) -> int:
        """Each tenant's memory: all fit beside each other, or (`swap`) no two do."""
        return GPU_MIB * 6 // 10 if self.swap else GPU_MIB // (self.tenants + 1)


def run_handoff_bench(
    iterations: int,
    client: str = "blocking",
    transport: str = "direct",
    queue_policy: str = "fifo",
    *,
    backend: str = NONE,
    hold_ms: float = HOLD_S * 1000,
    tenants: int = 2,
    swap: bool = False,
    rounds: int = 3,
) -> dict[str, Any]:
    """Run the bench and its same-run references; returns the bench's JSON fields."""
    setup = Setup(iterations, client, transport, queue_policy, backend, hold_ms, tenants, swap)
    setup.rounds = rounds
    setup.check()
    if backend == CUDA:
        from agent.parking.setup import nvml_gpus

        setup.gpu = next(iter(nvml_gpus()), "")
        if not setup.gpu:
            raise ValueError(f"backend {CUDA!r} needs a GPU and nvidia-ml-py; none was found")
    return asyncio.run(_bench(setup))


@dataclass
class Row:
    """One row's turns, pooled over the rounds: handoff gaps, and the time they fall in."""

    gaps: list[float] = field(default_factory=list)
    span: float = 0.0

    def add(self, turns: list[list[Any]]) -> None:
        """Take in one round's turn records."""
        self.gaps += handoffs(turns)
        if turns:
            self.span += max(r[4] for r in turns) - min(r[3] for r in turns)

    def figures(self, prefix: str) -> dict[str, Any]:
        """`<prefix>handoff_p50_ms`, `..._p99_ms`, `<prefix>handoff_samples` (a p99 over 100 or
        fewer is the largest) and `<prefix>idle_share`."""
        gaps = self.gaps or [float("nan")]
        idle = sum(self.gaps) / self.span if self.span > 0 else 0.0
        return {
            f"{prefix}handoff_p50_ms": _ms(percentile(gaps, 0.5)),
            f"{prefix}handoff_p99_ms": _ms(percentile(gaps, 0.99)),
            f"{prefix}handoff_samples": len(self.gaps),
            f"{prefix}idle_share": round(idle, 5),
        }


async def _bench(setup: Setup) -> dict[str, Any]:
    """The rows take turns, round after round, so that a load that comes and goes on the
    machine weighs on each alike."""
    rounds = max(1, min(setup.rounds, setup.iterations // 50))
    each = replace(setup, iterations=max(1, setup.iterations // rounds))
    bare = replace(each, backend=NONE, swap=False)
    main, agent, relay = Row(), Row(), Row()
    acquire: list[float] = []
    ref_acquire: list[float] = []
    for _ in range(rounds):
        solo, turns = await _agent_run(each, measure_acquire=True)
        acquire += solo
        main.add(turns)
        if setup.backend != NONE:
            agent.add((await _agent_run(bare, measure_acquire=False))[1])
        solo, turns = await _reference(each.iterations, setup.hold_ms, setup.tenants)
        ref_acquire += solo
        relay.add(turns)
    if not main.gaps:
        raise RuntimeError(too_short(each.iterations * rounds, "tenants"))
    figures: dict[str, Any] = {
        "acquire_p50_ms": _ms(percentile(acquire, 0.5)),
        "acquire_p99_ms": _ms(percentile(acquire, 0.99)),
        "acquire_samples": len(acquire),
        **main.figures(""),
        "iterations": each.iterations * rounds,
        "rounds": rounds,
        "client": setup.client,
        "transport": setup.transport,
        "backend": setup.backend,
        "hold_ms": setup.hold_ms,
        "tenants": setup.tenants,
        "swap": setup.swap,
    }
    if setup.backend != NONE:
        figures |= agent.figures("reference_agent_")
    figures["reference_acquire_p99_ms"] = _ms(percentile(ref_acquire, 0.99))
    figures["reference_acquire_samples"] = len(ref_acquire)
    return figures | relay.figures("reference_")


def too_short(iterations: int, who: str) -> str:
    """Why a run saw no handoff, and what to change."""
    turns = "1 turn" if iterations == 1 else f"{iterations} turns"
    return (
        f"no handoff seen in {turns} of each of the {who}: none asked while another held the "
        "turn; give more --iterations"
    )


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


async def _agent_run(setup: Setup, measure_acquire: bool) -> tuple[list[float], list[list[Any]]]:
    """A fresh agent with the setup's backend: the uncontended acquire, then the turns."""
    from agent.assembly import AgentConfig, build_agent

    workdir = tempfile.mkdtemp(dir="/tmp", prefix="baton-bench-")
    parking = ParkingOptions(
        backend=setup.backend,
        fake_gpus=str(GPU_MIB),
        fake_dir=f"{workdir}/fakegpu",
        host_memory_budget_mib=GPU_MIB * setup.tenants,
    )
    config = AgentConfig(
        socket=f"{workdir}/agent.sock",
        state_dir=f"{workdir}/state",
        http_host="127.0.0.1",
        http_port=0,
        queue_policy=setup.queue_policy,
        parking=parking,
    )
    agent = build_agent(config)
    await agent.start()
    try:
        acquire: list[float] = []
        if measure_acquire:
            solo = await _tenants(setup, config.socket, parking.fake_dir, "acquire", ["solo"])
            acquire = list(solo[0])
        names = [f"tenant-{i}" for i in range(setup.tenants)]
        runs = await _tenants(setup, config.socket, parking.fake_dir, "pingpong", names)
    finally:
        await agent.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return acquire, [record for run in runs for record in run]


async def _tenants(
    setup: Setup, socket: str, fake_dir: str, mode: str, names: list[str]
) -> list[Any]:
    common = [
        "--socket", socket, "--mode", mode, "--iterations", str(setup.iterations),
        "--gpu", setup.gpu, "--client", setup.client, "--transport", setup.transport,
        "--hold-ms", str(setup.hold_ms), "--backend", setup.backend,
        "--mib", str(setup.mib), "--fake-dir", fake_dir,
    ]  # fmt: skip
    held = _held_s(setup.iterations, setup.hold_ms, len(names)) if mode == "pingpong" else 0.0
    return await _spawn(TENANT, [[*common, "--name", name] for name in names], held)


def _held_s(iterations: int, hold_ms: float, tenants: int) -> float:
    """The time a run's turns are held in all, warm-up included: what its wait adds."""
    return tenants * (iterations + WARMUP) * hold_ms / 1000


async def _reference(
    iterations: int, hold_ms: float = HOLD_S * 1000, tenants: int = 2
) -> tuple[list[float], list[list[Any]]]:
    """The uncontended acquire and the turns against `commands.bench.relay`'s bare relay."""
    from commands.bench.relay import Relay

    workdir = tempfile.mkdtemp(dir="/tmp", prefix="baton-bench-ref-")
    path = f"{workdir}/relay.sock"
    server = await asyncio.start_unix_server(Relay().serve, path=path)
    try:
        args = ["--socket", path, "--iterations", str(iterations), "--hold-ms", str(hold_ms)]
        solo = await _spawn("commands.bench.relay", [[*args, "--mode", "acquire"]])
        held = _held_s(iterations, hold_ms, tenants)
        runs = await _spawn("commands.bench.relay", [[*args, "--mode", "pingpong"]] * tenants, held)
    finally:
        server.close()
        shutil.rmtree(workdir, ignore_errors=True)
    acquire = [granted - requested for requested, granted, _ in solo[0]]
    turns = sorted(
        (granted, name, requested, yielded)
        for name, run in enumerate(runs)
        for requested, granted, yielded in run
    )
    records = [
        [token, name, requested, granted, yielded]
        for token, (granted, name, requested, yielded) in enumerate(turns)
    ]
    return acquire, records


async def _spawn(module: str, argvs: list[list[str]], held_s: float = 0.0) -> list[Any]:
    """Run one tenant process per argv; start them together; their last lines, parsed. Each
    runs in a session of its own, so that Ctrl-C reaches the bench alone, which stops them.
    They get `TENANT_WAIT_S` and the `held_s` their turns are held to finish, all together."""
    procs: list[asyncio.subprocess.Process] = []
    within = TENANT_WAIT_S + held_s
    deadline = asyncio.get_running_loop().time() + within

    def left() -> float:
        return max(0.0, deadline - asyncio.get_running_loop().time())

    try:  # each one started is stopped, also when the run is interrupted while starting them
        for argv in argvs:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                module,
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
            procs.append(proc)
        for proc in procs:  # each says "ready" once connected; then all start together
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), min(60, left()))
            if line.strip() != b"ready":
                raise RuntimeError(f"bench tenant failed to start: {line!r}")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        results = []
        for proc in procs:
            out, _ = await asyncio.wait_for(proc.communicate(), left())
            if proc.returncode != 0:
                raise RuntimeError(f"bench tenant exited with {proc.returncode}")
            results.append(json.loads(out.decode().strip().splitlines()[-1]))
        return results
    except TimeoutError:
        raise RuntimeError(
            f"bench tenants ({module}) did not finish within {within:.0f} s"
        ) from None
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
