"""Tenant processes SIGKILLed while parked or waiting, and the agent's state directory unusable.

(A holder SIGKILLed is `tests/agent/server/test_agent_integration.py`.)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from commands.demo.fakenode import AgentProcess, FakeNodeOptions

from .figures import record, turn_figures
from .loadrun import LineProc
from .node import LoadNode

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def node() -> Iterator[LoadNode]:
    n = LoadNode("1x100", max_hold=30).start()
    yield n
    n.stop()


def tenant(node: LoadNode, name: str, *flags: str) -> LineProc:
    argv = [sys.executable, "-m", "tests.agent.parking.tenant_proc", "--name", name, "--declare"]
    return LineProc([*argv, "--mib", "60", *flags], node.tenant_env(node.gpu_ids[0]))


def settled(node: LoadNode) -> None:
    """Wait until the parking preparer has finished what was queued before now."""

    async def done() -> None:
        async with node.parking._lock:
            pass

    node.call(done())


def gone_within(node: LoadNode, proc: LineProc, name: str) -> float:
    """SIGKILL `proc`; seconds until the agent announces the tenant gone."""
    mark = node.mark()
    began = time.monotonic()
    proc.kill()
    node.wait_event(lambda e: e.kind == "tenant_gone" and e.tenant_id == name, 5, since=mark)
    return time.monotonic() - began


def test_a_parked_tenant_killed_releases_its_parked_bytes(node):
    """Promised: within 1 s of a parked tenant's death it is gone from the agent, its parked
    bytes are released (the parked-bytes gauge and the budget show it) and nothing of it stays."""
    a = tenant(node, "a", "--turns", "1", "--linger")
    procs = [a]
    try:
        assert a.line(30)["event"] == "turn" and a.line(30)["event"] == "done"
        b = tenant(node, "b", "--turns", "1", "--linger")
        procs.append(b)
        assert b.line(30)["event"] == "turn" and b.line(30)["event"] == "done"
        settled(node)
        residency = node.status()["residency"]
        assert residency["tenants"]["local/a"]["residency"] == "parked"
        assert node.parked_bytes() == residency["parked_bytes"] == 60 * 2**20
        parked_before = node.parked_bytes()
        seconds = gone_within(node, a, "local/a")
        settled(node)
        residency = node.status()["residency"]
        dirs = [d.name for d in node.tenant_dirs()]
    finally:
        for p in procs:
            p.kill()
    assert seconds < 1.0
    assert node.parked_bytes() == residency["parked_bytes"] == 0
    assert "local/a" not in residency["tenants"]
    assert dirs == ["local%2Fb"]
    released = parked_before - node.parked_bytes()
    record(
        "faults",
        "tenant SIGKILLed while parked",
        {"tenants_killed": 1, "gone_s": round(seconds, 3), "parked_bytes_released": released},
    )


def test_a_waiting_tenant_killed_leaves_the_queue_at_once(node):
    """Promised: within 1 s of a waiter's death its queue place is gone; the holder's yield then
    grants nobody, and the next newcomer is served."""
    a = tenant(node, "a", "--turns", "2", "--hold")
    procs = [a]
    try:
        assert a.line(30)["event"] == "holding"
        b = tenant(node, "b", "--turns", "1")
        procs.append(b)
        node.wait_event(lambda e: e.kind == "queued" and e.tenant_id == "local/b", 30)
        assert node.inspect(lambda s: [w.tenant_id for w in s.table.queue()]) == ["local/b"]
        seconds = gone_within(node, b, "local/b")
        assert node.inspect(lambda s: list(s.table.waiters)) == []
        a.send("go")
        after = [a.line(30) for _ in range(3)]
        assert [x["event"] for x in after] == ["turn", "turn", "done"]
        c = tenant(node, "c", "--turns", "1")
        procs.append(c)
        after += [c.line(30) for _ in range(2)]
        assert [x["event"] for x in after[3:]] == ["turn", "done"]
    finally:
        for p in procs:
            p.kill()
    assert seconds < 1.0
    figures = {"tenants_killed": 1, "gone_s": round(seconds, 3), **turn_figures(after)}
    record("faults", "tenant SIGKILLed while waiting", figures)


def agent_refuses(state_dir: str) -> tuple[str, dict[str, object]]:
    """Start `baton agent` on `state_dir`; it must exit non-zero. Returns what it said, and
    its exit status and how long it took to refuse."""
    work = tempfile.mkdtemp(prefix="baton-state-", dir="/tmp")
    argv = AgentProcess(work, FakeNodeOptions()).argv()
    argv[argv.index("--state-dir") + 1] = state_dir
    began = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired as exc:
        said = exc.stderr.decode() if isinstance(exc.stderr, bytes) else str(exc.stderr)
        pytest.fail(f"the agent ran on {state_dir} instead of refusing: {said[-1000:]}")
    finally:  # (its simulated GPUs' directory is made there before the state is read)
        shutil.rmtree(work, ignore_errors=True)
    assert done.returncode != 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    refused: dict[str, object] = {
        "exit_status": done.returncode,
        "refused_in_s": round(time.monotonic() - began, 2),
    }
    return done.stderr, refused


def test_an_unwritable_state_directory_stops_the_agent_at_start(tmp_path):
    """Promised: the agent says its state directory cannot be used and refuses to run."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    said, refused = agent_refuses(str(blocker / "state"))
    assert f"state directory {blocker / 'state'} is not writable" in said
    assert "--state-dir" in said
    record("faults", "agent state directory unwritable", refused)


@contextlib.contextmanager
def full_tmpfs() -> Iterator[Path]:
    """A 64 KiB tmpfs, filled up; skips where mounting is not allowed."""
    mnt = Path(tempfile.mkdtemp(prefix="baton-full-", dir="/tmp"))
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)])
    if mount.returncode != 0:
        mnt.rmdir()
        pytest.skip("cannot mount a tmpfs here (no privilege) to fill a disk")
    try:
        with contextlib.suppress(OSError), open(mnt / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        mnt.rmdir()


def test_a_full_disk_under_the_state_directory_stops_the_agent_at_start():
    """Promised: on a full file system the agent refuses to run rather than run without
    durable state, and says why."""
    with full_tmpfs() as mnt:
        state = mnt / "state"
        os.makedirs(state, exist_ok=True)
        said, refused = agent_refuses(str(state))
    assert "No space left on device" in said or "not writable" in said, said[-2000:]
    record("faults", "agent state directory on a full disk", refused)


def test_a_hung_holder_is_revoked_at_its_maximum_hold_parked_and_resumed_later():
    """Promised: a holder that never yields is revoked once its maximum hold has passed while
    others wait, and parked; the others take their turns; it gets its turn back later with its
    data intact. The checker finds no broken invariant in the whole run."""
    node = LoadNode("1x100", max_hold=0.5).start()
    a = tenant(node, "a", "--turns", "2", "--hold")
    procs = [a]
    try:
        assert a.line(30)["event"] == "holding"
        others = [tenant(node, n, "--turns", "2") for n in ("b", "c")]
        procs += others
        for p in others:
            assert [p.line(30)["event"] for _ in range(3)] == ["turn", "turn", "done"]
        a.send("go")
        assert [a.line(30)["event"] for _ in range(3)] == ["turn", "turn", "done"]
    finally:
        for p in procs:
            p.kill()
        node.stop()
    report = node.checker.check(max_wait=30)
    assert report.violations == []
    assert report.revocations >= 1 and report.turns["local/a"] >= 3, report.turns
    figures = {"revocations": report.revocations, "violations": len(report.violations)}
    figures |= {f"turns_{t.removeprefix('local/')}": n for t, n in sorted(report.turns.items())}
    record("faults", "tenant hung while others wait", figures)


def test_with_the_host_budget_exhausted_parks_are_refused_with_the_reason_and_nobody_is_killed():
    """Promised: when parking would pass the host DRAM budget the turn waits, the agent shows
    why (the numbers, in its status and a metric), no tenant process is killed, and the waiter
    gets its turn once a resident tenant leaves."""
    node = LoadNode("1x100", host_budget_mib=70, max_hold=30).start()
    a = tenant(node, "a", "--turns", "1", "--linger")
    procs = [a]
    try:
        assert [a.line(30)["event"] for _ in range(2)] == ["turn", "done"]
        b = tenant(node, "b", "--turns", "1", "--linger")
        procs.append(b)
        assert [b.line(30)["event"] for _ in range(2)] == ["turn", "done"]  # parks a: 60 <= 70
        c = tenant(node, "c", "--turns", "1")
        procs.append(c)
        node.wait_event(lambda e: e.kind == "queued" and e.tenant_id == "local/c", 30)
        settled(node)
        waiting = node.status()["residency"]["tenants"]["local/c"]["waiting"]
        refused = node.parking.metrics.registry.get_sample_value(
            "baton_refused_parks_total", {"reason": "host_budget"}
        )
        assert all(p.proc.poll() is None for p in procs), "a tenant was killed"
        b.send("go")  # b leaves: its memory goes, c fits
        assert [c.line(30)["event"] for _ in range(2)] == ["turn", "done"]
        assert a.proc.poll() is None
        killed = sum(p.proc.poll() not in (None, 0) for p in procs)
    finally:
        for p in procs:
            p.kill()
        node.stop()
    assert "over the 70 MiB budget" in waiting, waiting
    assert refused is not None and refused >= 1
    assert killed == 0
    figures = {"parks_refused": int(refused), "tenants": len(procs), "tenants_killed": killed}
    record("faults", "host DRAM budget exhausted", figures)
