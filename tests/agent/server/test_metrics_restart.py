"""The agent's /metrics across a restart: a counter that starts again at 0 only grows from
there, so Prometheus's `rate()` reads it right (a drop reads as a reset, a jump as real work)."""

from __future__ import annotations

import re
import time

from tests.harness.agent import AgentRunner, TenantProcess

GPU = "GPU-0"


def _busy(agent: AgentRunner) -> float:
    code, text = agent.http("/metrics")
    assert code == 200, text
    match = re.search(rf'^baton_gpu_busy_seconds_total{{gpu="{GPU}"}} (\S+)$', text, re.M)
    assert match, f"no busy seconds for {GPU} in /metrics"
    return float(match.group(1))


def test_a_turn_held_across_a_restart_adds_no_more_busy_seconds_than_pass(workdir: str) -> None:
    """The turn's time before the restart was the old agent's counter's: the new one counts
    from the restart, else at the turn's end `rate()` shows the GPU busy many times over."""
    first = AgentRunner(workdir, reconnect_grace=30).start()
    a = TenantProcess(first.socket, "a", [GPU])
    try:
        assert a.request("acquire")["ok"]
        first.stop()
        second = AgentRunner(workdir, reconnect_grace=30).start()
        try:
            second.wait_event(lambda e: e.kind == "connected" and e.tenant_id == "local/a")
            began = time.monotonic()  # the agent runs in this process: one monotonic clock
            during = _busy(second)
            assert a.request("yield")["ok"]
            after = _busy(second)
            ended = time.monotonic()
        finally:
            second.stop()
    finally:
        a.close()
    assert 0 < during <= after, "a counter never goes down"
    assert after - during <= ended - began + 1e-6, (
        f"busy seconds grew by {after - during:.3f} s in {ended - began:.3f} s of wall time"
    )
