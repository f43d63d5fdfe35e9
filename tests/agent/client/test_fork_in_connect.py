"""A child forked while another thread of its parent was inside `Baton.connect()` (a
DataLoader's fork workers started as a background thread connects): its copy of the client is
its parent's, half open, and every call it makes says so at once, as for a session the parent
had opened, instead of waiting for ever on the connect lock copied in its locked state."""

from __future__ import annotations

import os
import select
import signal
import threading

import pytest

from agent.client import Baton
from agent.client.errors import BatonError
from tests.harness.agent import AgentRunner

pytestmark = pytest.mark.timeout(60)
WAIT_S = 10.0
"""Bound on every wait in this test."""


def forked(call: str, baton: Baton) -> tuple[str, int]:
    """What `call` on `baton` in a forked child raised (or "returned"), and the child's exit
    status; "no answer" if it had none within `WAIT_S` (the child is then killed)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one call, its outcome on the pipe, out (no cleanup of the parent's)
        os.close(read_end)
        try:
            getattr(baton, call)()
            outcome = "returned"
        except BatonError as exc:
            outcome = f"raised {type(exc).__name__}: {exc}"
        except BaseException as exc:  # (anything else: the test says what)
            outcome = f"raised {exc!r}"
        os.write(write_end, outcome.encode())
        os._exit(0)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], WAIT_S)
        outcome = os.read(read_end, 4096).decode() if ready else "no answer"
    finally:
        os.close(read_end)
        if outcome == "no answer":
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)  # (it has exited, or was killed)
    return outcome, os.waitstatus_to_exitcode(status)


@pytest.mark.parametrize("call", ["connect", "acquire"])
def test_a_child_forked_during_connect_is_told_to_make_its_own_baton(
    agent: AgentRunner, call: str
) -> None:
    baton = Baton(agent.socket, ["GPU-0"], name="forker")
    began, opens = threading.Event(), threading.Event()
    open_session = baton._open

    def held() -> object:  # the parent's connect, under way (an agent slow to answer)
        began.set()
        assert opens.wait(WAIT_S), "the test never let the connect go on"
        return open_session()

    baton._open = held  # type: ignore[method-assign,assignment]
    connecting = threading.Thread(target=baton.connect)
    try:
        connecting.start()
        assert began.wait(WAIT_S), "the connect never began"
        outcome, status = forked(call, baton)
        opens.set()
        connecting.join(WAIT_S)
        assert not connecting.is_alive()
        assert outcome.startswith(
            f"raised BatonError: this Baton client's session belongs to process {os.getpid()}, "
            "which forked"
        ), outcome
        assert outcome.endswith("create a new Baton in the child"), outcome
        assert status == 0
        assert baton.acquire(WAIT_S).gpus == ("GPU-0",)  # the parent's session is whole
    finally:
        opens.set()
        baton.close()
