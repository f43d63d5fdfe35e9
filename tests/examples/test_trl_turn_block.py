"""A `with baton.turn():` block holds its turn until the block ends, also when a `train()` called
inside it raises: the block's error handling (an emergency save, a look at the weights) runs
inside the turn."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from tests.examples.test_trl_callback import recorded, watched

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl")


@needs_trl
@pytest.mark.timeout(120)
def test_a_train_that_raises_inside_a_turn_block_leaves_the_blocks_turn_held(
    tmp_path: Path,
) -> None:
    from agent.examples.trl_train.jobs import TrlConfig

    baton, callback = recorded()
    config = TrlConfig(kind="sft", seed=5, batch=4)
    job = watched(callback, config, 2, tmp_path, [callback], callback.off_turn)

    def fail(module: Any, args: Any) -> None:
        raise RuntimeError("the loss went wrong")

    job.model.register_forward_pre_hook(fail)
    with callback.turn():
        with pytest.raises(RuntimeError, match="the loss went wrong"):
            job.train()
        assert callback.holding  # the block's device work after the error is inside its turn
    assert not callback.holding
    assert baton.events.count("acquire") == baton.events.count("yield")
