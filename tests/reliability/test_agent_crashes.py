"""`baton agent` SIGKILLed mid-restore or while a lease is held, then started again.

(Killed mid-park is `tests/agent/parking/test_agent_crash.py`.) The tenants are processes running
`tests.agent.parking.tenant_proc`: each turn verifies the pattern the previous turn wrote.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator

import pytest

from commands.demo.fakenode import AgentProcess, FakeNodeOptions, tenant_env

from .figures import record, turn_figures
from .loadrun import LineProc

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def workdir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="baton-crash-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def tenant(node: AgentProcess, name: str, *flags: str) -> LineProc:
    argv = [sys.executable, "-m", "tests.agent.parking.tenant_proc", "--name", name, "--declare"]
    return LineProc([*argv, *flags], tenant_env(node.socket, node.fake_dir))


def until(proc: LineProc, kind: str, timeout: float = 30) -> list[dict]:
    """The tenant's lines up to the first of `kind`; an error line fails."""
    seen = []
    while True:
        line = proc.line(timeout)
        seen.append(line)
        assert line["event"] != "error", (proc.name, line)
        if line["event"] == kind:
            return seen


def wait_for(node: AgentProcess, pattern: str, procs: list[LineProc]) -> str:
    """The agent's log line matching `pattern`; on a timeout, what the tenants said too."""
    try:
        return node.wait_for(pattern, 40)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n" + "\n".join(p.name + p.said() for p in procs)) from None


def holders(node: AgentProcess) -> dict[str, str]:
    url = f"http://127.0.0.1:{node.http_port}/v1/status"
    with urllib.request.urlopen(url, timeout=5) as r:
        gpus = json.load(r)["gpus"]
    return {gpu: state["holder"] for gpu, state in gpus.items()}


def test_an_agent_killed_mid_restore_loses_nothing_and_everyone_gets_turns_again(workdir):
    """Promised: a restore cut short by SIGKILL leaves one whole copy; after the restart every
    tenant's data verifies on every later turn and both tenants finish all their turns."""
    node = AgentProcess(
        workdir, FakeNodeOptions(fake_gpus="1x100", pcie_gbps=0.2, reconnect_grace=30)
    )
    node.start()
    procs = [tenant(node, n, "--mib", "60", "--turns", "3", "--pause-after", "0") for n in "ab"]
    seen: list[dict] = []
    try:
        for p in procs:  # both resident once, so a's next turn restores it
            seen.append(p.line(30))
            assert seen[-1]["event"] == "turn"
        for p in procs:
            p.send("go")
        mid_restore = wait_for(node, r"copied .*\.dev\.moving; committing", procs)
        killed = time.monotonic()
        node.kill()
        node.start()
        node.wait_for("reconciled an interrupted move", 10)
        recovered_s = time.monotonic() - killed
        for p in procs:
            lines = until(p, "done", 60)
            seen += lines
            assert [line["i"] for line in lines if line["event"] == "turn"] == [1, 2]
    finally:
        for p in procs:
            p.kill()
        node.stop()
    assert ".dev.moving" in mid_restore
    figures = turn_figures(seen)
    assert figures["turns_verified"] == 2 * len(procs)
    record(
        "faults",
        "agent SIGKILLed mid-restore",
        {"agents_killed": 1, "restart_to_reconciled_s": round(recovered_s, 3), **figures},
    )


def test_an_agent_killed_while_a_lease_is_held_keeps_the_holders_turn(workdir):
    """Promised: the holder keeps its turn across the crash (it reconnects within the grace
    period), a newcomer is not granted meanwhile, fencing tokens never go back, and both
    tenants then take their turns with their data intact."""
    node = AgentProcess(workdir, FakeNodeOptions(fake_gpus="1x100", reconnect_grace=30))
    node.start()
    a = tenant(node, "a", "--mib", "60", "--turns", "2", "--hold")
    procs = [a]
    try:
        until(a, "holding")
        killed = time.monotonic()
        node.kill()
        node.start()
        node.wait_for(r"restored 1 tenant and 1 lease \(", 10)
        recovered_s = time.monotonic() - killed
        assert set(holders(node).values()) == {"local/a"}
        b = tenant(node, "b", "--mib", "60", "--turns", "2")
        procs.append(b)
        node.wait_for("session opened: tenant local/b", 30)
        node.wait_for("session opened: tenant local/a", 30)
        assert set(holders(node).values()) == {"local/a"}
        a.send("go")
        try:
            lines_a, lines_b = until(a, "done"), until(b, "done")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nagent log:\n" + "\n".join(node.lines[-40:])) from None
    finally:
        for p in procs:
            p.kill()
        node.stop()
    tokens = [next(iter(x["tokens"].values())) for x in lines_a + lines_b if x["event"] == "turn"]
    assert [x["i"] for x in lines_a if x["event"] == "turn"] == [0, 1]
    assert [x["i"] for x in lines_b if x["event"] == "turn"] == [0, 1]
    assert len(set(tokens)) == 4 and tokens[0] == min(tokens), tokens
    figures = {"agents_killed": 1, "kill_to_lease_restored_s": round(recovered_s, 3)}
    figures |= turn_figures(lines_a + lines_b) | {"fencing_tokens_distinct": len(set(tokens))}
    record("faults", "agent SIGKILLed while a lease is held", figures)
