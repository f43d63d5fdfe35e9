"""Hundreds of tenant processes leave right after their turn while the agent parks them: each
park either runs to its end before the process exits or is never started (no process dies in
the middle of moving its memory, as a daemon callback thread cut off by the exit used to)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path

import pytest

from agent.client import Baton
from agent.parking.setup import ParkingOptions
from baton.contract.names import ENV_AGENT_SOCKET, ENV_GPUS, fake_gpu_uuid
from tests.harness.agent import AgentRunner

LEAVERS = 60
"""Leaving processes in the suite's run; `pytest -m soak` runs `SOAK_LEAVERS`."""
SOAK_LEAVERS = 400
AT_ONCE = 8
TENANT = str(Path(__file__).with_name("exit_tenant.py"))


async def leave(env: dict[str, str], i: int, gate: asyncio.Semaphore) -> tuple[int, str]:
    how = ("close", "exit")[i % 2]
    async with gate:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, TENANT, f"leaver-{i}", str(2 * (i % 12)), how,
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode() + err.decode()


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "leavers", [LEAVERS, pytest.param(SOAK_LEAVERS, marks=pytest.mark.soak)], ids=["", "soak"]
)
def test_tenants_leaving_during_their_park_never_exit_in_the_middle_of_it(
    workdir: str, leavers: int
) -> None:

    parking = ParkingOptions(backend="app", fake_gpus="1x100")
    with AgentRunner(workdir, parking=parking) as agent:
        gpu = fake_gpu_uuid(0)
        env = {**os.environ, ENV_AGENT_SOCKET: agent.socket, ENV_GPUS: gpu}
        stayer = Baton(agent.socket, [gpu], name="stayer", gpu_memory_mib=60,
                       on_park=lambda g: 0, on_restore=lambda g: 0)  # fmt: skip
        done = threading.Event()

        def take_turns() -> None:  # each turn needs the room a leaver holds: it is parked
            while not done.is_set():
                with stayer.turn(timeout=60):
                    pass

        turns = threading.Thread(target=take_turns)
        turns.start()

        async def everyone() -> list[tuple[int, str]]:
            gate = asyncio.Semaphore(AT_ONCE)
            return await asyncio.gather(*(leave(env, i, gate) for i in range(leavers)))

        try:
            results = asyncio.run(everyone())
        finally:
            done.set()
            turns.join(60)
            stayer.close()
    cut = [out for rc, out in results if rc != 0 or out.count("parking") != out.count("parked")]
    assert cut == [], f"{len(cut)} of {leavers} left mid-park; first:\n{cut[0]}"
    parked = sum(out.count("parked") for _, out in results)
    assert parked >= leavers // 10, f"only {parked} parks raced an exit: the test proves little"
