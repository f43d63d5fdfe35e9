"""Many tenant processes taking turns on few fake GPUs, judged from the agent's event stream."""

from __future__ import annotations

import pytest

from .figures import record
from .loadrun import run_agent_load


def assert_held(tenants: int, gpus: int, seconds: float) -> None:
    result = run_agent_load(tenants, gpus, seconds)
    report = result.report
    figures = result.figures(tenants, gpus, seconds)
    print(figures)
    record("load", f"agent: {tenants} tenants over {gpus} GPUs, {seconds:g} s, lrs", figures)
    assert report.violations == [], report.violations[:10]
    assert result.tenant_errors == [], result.tenant_errors[:10]
    assert len(report.turns) == tenants, "every tenant got turns"
    assert report.parks > 0 and report.restores > 0, "the footprints forced parks"
    assert result.verified >= tenants, "tenants verified their data after turns"
    assert report.fairness >= 0.95, report.turns


@pytest.mark.timeout(150)
def test_sixteen_tenants_over_four_gpus_keep_every_promise():
    """Promised: one holder per GPU, a parked tenant is restored before its turn, fencing
    tokens increase, data verifies, waits stay within the policy's bound, lrs is fair."""
    assert_held(16, 4, 15)


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_sixty_four_tenants_over_eight_gpus_for_ten_minutes():
    """The same promises as the short run, with 64 tenant processes for 10 minutes."""
    assert_held(64, 8, 600)
