"""A local node starts without an earlier node's host directories, and gives back what it moved.

An agent that loaded the state an earlier node left in /var/lib/baton brought back that node's
tenants, their parked memory and their accounting: on a fresh cluster they counted against the
host budget, and the scheduler kept a new tenant off the GPU beside two others.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from commands.localnode.node import ScratchDirs
from commands.localnode.procs import LocalNodeError


def test_a_directory_left_by_an_earlier_node_is_away_while_the_node_runs_and_back_after(
    tmp_path: Path,
) -> None:
    state, fresh = tmp_path / "baton", tmp_path / "fake-gpus"
    state.mkdir()
    (state / "agent-state.json").write_text('{"tenants": ["from an earlier node"]}')
    scratch = ScratchDirs((state, fresh))
    scratch.set_aside()
    assert not state.exists() and not fresh.exists()  # the node starts from nothing
    state.mkdir()
    (state / "agent-state.json").write_text("{}")  # what this node's agent wrote
    fresh.mkdir()
    scratch.put_back()
    assert (state / "agent-state.json").read_text() == '{"tenants": ["from an earlier node"]}'
    assert not fresh.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["baton"]


def test_a_directory_set_aside_by_a_node_that_never_closed_is_named_not_overwritten(
    tmp_path: Path,
) -> None:
    state = tmp_path / "baton"
    ScratchDirs.aside_of(state).mkdir()
    state.mkdir()
    with pytest.raises(LocalNodeError, match=r"\.baton\.before-localnode was set aside .* move it"):
        ScratchDirs((state,)).set_aside()
    assert state.exists()
