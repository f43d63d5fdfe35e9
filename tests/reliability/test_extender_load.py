"""Concurrent scheduler clients against the extender while its watch delivers churn."""

from __future__ import annotations

import pytest

from .extender_load import ExtenderLoad
from .figures import record

MAX_API_CONNECTIONS = 40
"""Connections the extender may open to the API server in a run: its watches and lists, and
one per bind in flight; a bind that left its responses unread opened two more every time."""


def assert_held(
    nodes: int,
    pods: int,
    clients: int,
    seconds: float,
    p99_ms: float,
    compact_every_s: float | None = None,
) -> None:
    """One client first (the same-run reference, short so that it fills few slots), then
    `clients` with `pods` pods pending; with `compact_every_s`, the extender's watches are made
    to relist that often while binds go on."""
    load = ExtenderLoad(nodes, pods, compact_every_s=compact_every_s)
    try:
        single = load.run(1, min(10.0, max(2.0, seconds / 10)))
        tally = load.run(clients, seconds, pending=pods)
        double = load.double_booked()
        connections = load.api.connections_accepted
        pod_lists = load.api.requests("list", "pods")
    finally:
        load.close()
    first_pages = [r for r in pod_lists if not r.query.get("continue")]
    calls = sum(tally.statuses.values())
    figures = {
        "nodes": nodes,
        "clients": clients,
        "seconds": seconds,
        "calls": calls,
        "calls_per_s": round(calls / seconds, 1),
        "binds": len(tally.bound) + tally.churn["bound pod deleted"],
        "bind_errors": len(tally.bind_errors),
        **{f"{verb}_p99_ms": round(tally.p99_ms(verb), 1) for verb in tally.latency},
        **{f"single_client_{v}_p99_ms": round(single.p99_ms(v), 1) for v in single.latency},
        "single_client_calls": sum(single.statuses.values()),
        "churn_events": sum(tally.churn.values()),
        "non_200": calls - tally.statuses[200],
        "double_booked": len(double),
        "pod_relists": len(first_pages) - 1,
    }
    print(figures, tally.bind_errors[:5])
    record("load", f"extender: {clients} clients, {nodes} nodes, {seconds:g} s", figures)
    assert double == []
    assert set(tally.statuses) == {200}, tally.statuses
    assert set(single.statuses) == {200}, single.statuses
    assert figures["binds"] > 0 and figures["churn_events"] > 0
    if compact_every_s:  # the extender did relist, in pages, while binds went on
        assert tally.churn["watch history compacted"] > 0, tally.churn
        assert figures["pod_relists"] > 0, figures
        assert len(pod_lists) > len(first_pages), "no relist took more than one page"
    # Binds reuse the extender's pooled API connections instead of opening one per call.
    assert connections <= MAX_API_CONNECTIONS, (connections, figures["binds"])
    for verb in ("filter", "prioritize"):
        assert tally.p99_ms(verb) < p99_ms, (verb, figures)


@pytest.mark.timeout(120)
def test_twenty_clients_on_a_churning_cache_never_double_book():
    """Promised: no slot is ever double-booked, every answer is 200, and filter/prioritize stay
    fast (issue 5 targets p99 < 20 ms; on this shared machine the short run asserts < 500 ms)."""
    assert_held(nodes=300, pods=1200, clients=20, seconds=8, p99_ms=500, compact_every_s=1.0)


@pytest.mark.soak
@pytest.mark.timeout(1200)
def test_twenty_clients_on_five_thousand_nodes_for_five_minutes():
    """The same promises on the 5000-node cache for five minutes, p99 held to issue 5's 20 ms."""
    assert_held(nodes=5000, pods=20000, clients=20, seconds=300, p99_ms=20)
