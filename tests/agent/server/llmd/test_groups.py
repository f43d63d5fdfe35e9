"""Groups from `--llmd-group`, and a group's state from its facts."""

from __future__ import annotations

import pytest

from agent.server.llmd import groups as g


def test_group_specs_parse_and_bad_ones_say_how_to_write_them() -> None:
    groups = g.Groups.from_specs(["trainers=GPU-1, GPU-0", "samplers=GPU-2"])
    assert groups.names() == ["samplers", "trainers"]
    assert groups.gpus("trainers") == ("GPU-0", "GPU-1")
    assert groups.gpus("nope") is None
    for bad in ("trainers", "=GPU-0", "trainers=", "two words=GPU-0"):
        with pytest.raises(g.GroupSpecError, match="NAME=GPU"):
            g.parse_group(bad)
    with pytest.raises(g.GroupSpecError, match="twice"):
        g.Groups.from_specs(["a=GPU-0", "a=GPU-1"])


def test_a_group_naming_a_gpu_the_node_lacks_is_refused_where_the_node_knows_its_gpus() -> None:
    groups = g.Groups.from_specs(["trainers=GPU-0,GPU-a"])
    groups.check_gpus({})  # --backend none: any name goes
    groups.check_gpus({"GPU-0", "GPU-a"})
    with pytest.raises(g.GroupSpecError) as err:
        groups.check_gpus({"GPU-a", "GPU-b"})
    assert str(err.value) == (
        "trainers=GPU-0,GPU-a: GPU-0: not a GPU of this node (it has GPU-a, GPU-b)"
    )


@pytest.mark.parametrize(
    ("facts", "state"),
    [
        (g.GroupFacts(), g.IDLE),
        (g.GroupFacts(holder="a", loaded="a"), g.LOCKED),
        (g.GroupFacts(holder="a", switching_to="b"), g.SWITCHING),
        (g.GroupFacts(last_holder="a"), g.IDLE_YIELDED),
        (g.GroupFacts(loaded="b"), g.IDLE_YIELDED),
    ],
)
def test_group_state_follows_the_facts(facts: g.GroupFacts, state: str) -> None:
    assert g.group_state(facts) == state


def test_state_clock_keeps_the_time_a_state_began() -> None:
    clock = g.StateClock()
    assert clock.observe("t", g.IDLE, 1.0) == 1.0
    assert clock.observe("t", g.IDLE, 5.0) == 1.0
    assert clock.observe("t", g.LOCKED, 6.0) == 6.0
