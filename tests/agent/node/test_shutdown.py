"""`baton agent` as a process: SIGTERM or SIGINT stops it cleanly; a new agent finds its state."""

from __future__ import annotations

import signal

import pytest

from tests.e2e.processes import Daemon
from tests.harness.agent import AgentRunner, TenantProcess

STOP_TIMEOUT_S = 10.0


def start_agent(workdir: str) -> Daemon:
    """`baton agent` with the socket and state directory `AgentRunner(workdir)` uses."""
    env = {
        "BATON_AGENT_STATE_DIR": f"{workdir}/state",
        "BATON_AGENT_HTTP_PORT": "0",
        "BATON_AGENT_SHUTDOWN_GRACE": "1",
    }
    agent = Daemon("agent", ["agent", "--socket", f"{workdir}/agent.sock"], env)
    agent.wait_for_line(r"agent ready", timeout=30)
    return agent


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_ends_the_agent_with_0_and_keeps_its_state(
    workdir: str, sig: signal.Signals
) -> None:
    agent = start_agent(workdir)
    holder = TenantProcess(f"{workdir}/agent.sock", "a", ["GPU-0"])
    try:
        lease = holder.request("acquire")
        assert lease["ok"], lease
        agent.proc.send_signal(sig)
        assert agent.proc.wait(STOP_TIMEOUT_S) == 0, agent.log()
        agent.wait_for_line(rf"agent stopped on {sig.name}; tenants, leases and parked memory")
        with AgentRunner(workdir, reconnect_grace=30) as restarted:
            restarted.wait_event(lambda e: e.kind == "connected" and e.tenant_id == "local/a")
            status = restarted.status()["gpus"]["GPU-0"]
            assert status["holder"] == "local/a"
            assert status["lease_id"] == lease["lease_id"]
            assert holder.request("yield")["ok"]
    finally:
        holder.close()
        agent.stop()


def test_an_idle_agent_stops_quietly_on_sigterm(workdir: str) -> None:
    agent = start_agent(workdir)
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(STOP_TIMEOUT_S) == 0, agent.log()
    stopped = agent.wait_for_line(r"agent stopped on (\w+)")
    assert stopped.group(1) == "SIGTERM"
    assert "Traceback" not in agent.log()
