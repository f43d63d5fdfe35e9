"""`baton bench extender`: what it reports of the tenant pods it was asked to place."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    small = ("--iterations", "10")
    return subprocess.run(
        [sys.executable, "-m", "baton", "bench", "extender", *small, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("as_json", [False, True])
def test_a_run_that_placed_fewer_pods_than_asked_says_so(as_json: bool) -> None:
    """10 nodes of 8 GPUs take most of the 200 pods asked, not all of them (some land on a
    node with no room left), though the cluster has room for them: the line says how the pods
    were placed, not that they did not fit."""
    done = _bench(
        "--nodes", "10", "--pods", "200", "--binds", "1", *(["--json"] if as_json else [])
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.splitlines()[-1])
    placed = figures["pods"]
    assert 0 < placed < 200
    assert (figures["pods_asked"], figures["pods_unplaced"]) == (200, 200 - placed)
    said = (
        f"baton bench extender: only {placed} of the 200 pods asked (--pods) were placed (each "
        "goes to one random node of the 10 and is left out if that node has no room); the "
        "figures are for a cluster of that many: give more --nodes or fewer --pods"
    )
    assert done.stderr.splitlines() == [said]
    if not as_json:
        assert f"pods_unplaced: {200 - placed}" in [
            line.strip() for line in done.stdout.splitlines()
        ]


def test_a_run_that_placed_every_pod_asked_says_nothing_more() -> None:
    done = _bench("--nodes", "10", "--pods", "20", "--binds", "1", "--json")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.splitlines()[-1])
    assert (figures["pods"], figures["pods_asked"], figures["pods_unplaced"]) == (20, 20, 0)
    assert done.stderr == ""


def test_a_cluster_too_full_for_any_bind_gives_no_bind_figures_and_says_why() -> None:
    """Every pending pod's filter passes no node of a full cluster: no bind is timed."""
    done = _bench("--nodes", "10", "--pods", "1000", "--binds", "2", "--json")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.splitlines()[-1])
    assert (figures["bind_p50_ms"], figures["bind_p99_ms"], figures["bind_errors"]) == (
        None,
        None,
        2,
    )
    assert done.stderr.splitlines()[1:] == [
        "baton bench extender: none of the 2 pods to bind (--binds) passed filter on any node, "
        "so no bind was timed: give more --nodes or fewer --pods"
    ]


def test_pods_left_out_are_those_their_one_random_node_had_no_room_for() -> None:
    """What the line says: at 10 nodes and 200 pods some are left out though every node could
    still take a pod of one of the shapes."""
    import random
    import time

    from commands.bench import extender as bench
    from extender.placement import Limits
    from extender.state import ClusterState

    state = ClusterState(Limits(), time.monotonic)
    state.replace_nodes(bench._node(f"node-{i:05d}") for i in range(10))
    placed = bench._place_tenants(state, random.Random(1), 10, 200)
    assert placed < 200
    room = bench._place_tenants(state, random.Random(2), 10, 10)
    assert room > 0  # the cluster was not full: the ones left out missed their node only
