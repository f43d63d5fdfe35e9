"""An agent process SIGKILLed in the middle of a park, then started again on the same node."""

from __future__ import annotations

import asyncio
import shutil
import tempfile

import pytest

from commands.demo.fakenode import AgentProcess, FakeNodeOptions, tenant_env

from .nodeharness import TenantProc

pytestmark = pytest.mark.timeout(90)


def test_an_agent_killed_mid_park_loses_nothing_and_everyone_gets_turns_again():
    workdir = tempfile.mkdtemp(prefix="baton-crash-", dir="/tmp")
    node = AgentProcess(
        workdir, FakeNodeOptions(fake_gpus="1x100", pcie_gbps=0.2, reconnect_grace=30)
    )

    async def scenario() -> None:
        node.start()
        env = tenant_env(node.socket, node.fake_dir)
        a = await TenantProc.start(env, "a", 60, "--turns", "3", "--pause-after", "0")
        tenants = [a]
        try:
            await a.until("turn")
            tenants.append(await TenantProc.start(env, "b", 60, "--turns", "3"))
            try:
                mid_park = await asyncio.to_thread(
                    node.wait_for, r"copied .*\.host\.moving; committing", 30
                )
            except TimeoutError as e:
                raise AssertionError("\n".join([str(e), *(t.describe() for t in tenants)])) from e
            node.kill()
            assert "local%2Fa/GPU-fake-0000.host.moving" in mid_park
            node.start()
            node.wait_for("reconciled an interrupted move: removed half-written", 10)
            await tenants[1].until("done", 60)
            a.tell()
            await a.until("done", 60)
            for t in tenants:
                assert [e["i"] for e in t.events if e["event"] == "turn"] == [0, 1, 2]
                assert await t.exit_code() == 0
        finally:
            for t in tenants:
                await t.reap()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 80))
    finally:
        node.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_an_agent_that_is_not_ready_in_time_is_stopped_not_left_running(tmp_path):
    node = AgentProcess(str(tmp_path), FakeNodeOptions(fake_gpus="1x100"))
    with pytest.raises(TimeoutError, match="agent ready"):
        node.start(timeout=0.001)  # far less than the interpreter takes to start
    assert node.proc is not None and node.proc.poll() is not None
