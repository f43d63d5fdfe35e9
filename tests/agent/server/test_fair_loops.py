"""Tenants written as the plain loop `while ...: with baton.turn(): step()`, each its own process
against a real agent under the fair policy, get their shares (within 5 points, by their own
clocks) where one duty is above one half and where turn lengths differ tenfold; never two
holders at once. The yielder competes for the next turn (`agent.core.anticipation`)."""

from __future__ import annotations

import itertools

import pytest

from agent.core.fair import FairConfig
from commands.bench.fairness_procs import Turn, run_mix
from commands.bench.shares import MIXES

pytestmark = [pytest.mark.timeout(120), pytest.mark.alone]  # (the shares are timed: no neighbour)


@pytest.mark.parametrize(
    ("mix", "seconds", "client"),
    [("duty-above-half", 6.0, "blocking"), ("tenfold", 8.0, "blocking"), ("tenfold", 8.0, "async")],
)
def test_looping_tenants_get_their_shares(mix: str, seconds: float, client: str) -> None:
    out = run_mix(MIXES[mix], seconds, "fair", FairConfig(), client)
    assert_one_holder_at_a_time(out["turns"])
    for name, tenant in out["tenants"].items():
        assert tenant["asks_its_share"]
        assert tenant["measured_share"] == pytest.approx(tenant["entitled_share"], abs=0.05), name


def assert_one_holder_at_a_time(turns: dict[str, list[Turn]]) -> None:
    """Each turn as its tenant saw it (granted to yielded) ends before the next one starts."""
    held = sorted(
        (granted, yielded, name) for name, ts in turns.items() for _, granted, yielded in ts
    )
    assert len(held) > 20
    for (_, ended, before), (started, _, after) in itertools.pairwise(held):
        assert ended <= started, f"{before} and {after} held the GPU at once"
