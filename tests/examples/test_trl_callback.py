"""`BatonCallback` inside a real GRPOTrainer: every forward pass (generation, reference and old
log-probs, the loss) and every optimizer step run inside a turn; the wrapped reward outside."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl")


class Recorder:
    """Stands in for `Baton`: records acquires and yields."""

    lease = None

    def __init__(self) -> None:
        self.events: list[str] = []

    def register_callbacks(self, *_: Any) -> None:
        pass

    def acquire(self, timeout: float | None = None) -> Any:
        self.events.append("acquire")
        return type("Lease", (), {"lease_id": str(len(self.events))})()

    def yield_(self) -> None:
        self.events.append("yield")

    def close(self) -> None:
        pass


def recorded() -> tuple[Recorder, Any]:
    """A `BatonCallback` over a `Recorder`, the example job's randomness fixed."""
    from agent.client.trl import BatonCallback
    from agent.examples.trl_train.jobs import deterministic

    deterministic()
    baton = Recorder()
    return baton, BatonCallback(baton)  # type: ignore[arg-type]


def watched(
    callback: Any, config: Any, steps: int, workdir: Path, callbacks: list[Any], wrap: Any
) -> Any:
    """The example job's trainer, built inside a turn (it places the model) and watched."""
    from agent.examples.trl_train.jobs import trainer

    with callback.turn():
        job = trainer(config, steps, workdir, callbacks, wrap)
        callback.watch(job)
    return job


@needs_trl
@pytest.mark.timeout(120)
def test_every_device_phase_of_a_grpo_step_is_inside_a_turn(tmp_path: Path) -> None:
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    from transformers import TrainerCallback

    from agent.examples.trl_train.jobs import TrlConfig

    baton, callback = recorded()
    outside: list[str] = []
    rewards: list[bool] = []

    class Probe(TrainerCallback):  # runs before BatonCallback: the step's logging reads the loss
        def on_log(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if not callback.holding and "train_loss" not in kw["logs"]:
                outside.append("log")

    def wrap(fn: Any) -> Any:
        def reward(*a: Any, **k: Any) -> Any:
            rewards.append(callback.holding)
            return fn(*a, **k)

        return callback.off_turn(reward)

    config = TrlConfig(
        kind="grpo", seed=3, batch=4, group=4, accumulation=2, iterations=2, off_s=0.001
    )
    job = watched(callback, config, 3, tmp_path, [Probe(), callback], wrap)
    for module in (job.model, job.ref_model):
        module.register_forward_pre_hook(
            lambda m, a: None if callback.holding else outside.append("forward")
        )
    hook = register_optimizer_step_pre_hook(
        lambda o, a, k: None if callback.holding else outside.append("step")
    )
    try:
        job.train()
    finally:
        hook.remove()
    assert outside == [] and not callback.holding
    assert rewards and not any(rewards)  # the wrapped reward saw no turn held
    assert baton.events.count("acquire") == baton.events.count("yield") >= 4
    assert callback.parker is not None and callback.parker.stats.copied_bytes > 0
    assert all(t[2] <= t[3] for t in callback.turns)


@needs_trl
@pytest.mark.timeout(120)
def test_callbacks_before_and_after_batons_and_trls_reference_sync_run_inside_the_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL lists its SyncRefModelCallback after the user's callbacks; on steps that do not log,
    the turn used to end at BatonCallback's own on_step_end, before them."""
    from transformers import TrainerCallback
    from trl.trainer.callbacks import SyncRefModelCallback

    from agent.client.trl import BatonCallback
    from agent.examples.trl_train.jobs import TrlConfig, deterministic

    deterministic()
    callback = BatonCallback(Recorder())  # type: ignore[arg-type]
    seen: dict[str, list[bool]] = {"early step begin": [], "late step end": [], "sync": []}

    built: list[Any] = []

    class Early(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            seen["early step begin"].append(callback.holding)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            built[0].log({"probe": 1.0})  # an event inside an event: on_log must end nothing

    class Late(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            seen["late step end"].append(callback.holding)

    sync = SyncRefModelCallback.sync_target_model

    def recorded_sync(model: Any, target: Any, alpha: float) -> None:
        seen["sync"].append(callback.holding)
        sync(model, target, alpha)

    monkeypatch.setattr(SyncRefModelCallback, "sync_target_model", staticmethod(recorded_sync))
    config = TrlConfig(kind="grpo", seed=4, batch=4, group=4, sync_ref_steps=1, log_steps=3)
    job = watched(callback, config, 4, tmp_path, [Early(), callback, Late()], callback.off_turn)
    built.append(job)
    job.train()
    assert seen == {key: [True] * 4 for key in seen}
    assert not callback.holding


@needs_trl
def test_a_callback_whose_trainer_was_not_watched_says_so_and_still_takes_turns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from agent.client.trl import BatonCallback

    baton = Recorder()
    callback = BatonCallback(baton, park=False)  # type: ignore[arg-type]
    args, state, control = TrainingArguments(output_dir="unused"), TrainerState(), TrainerControl()
    with caplog.at_level("WARNING", logger="baton.client"):
        callback.on_train_begin(args, state, control)
    assert "call watch(trainer)" in caplog.text and callback.holding
    callback.on_step_end(args, state, control)  # nothing follows: the turn ends here
    assert not callback.holding and baton.events == ["acquire", "yield"]


@needs_trl
@pytest.mark.timeout(120)
def test_a_step_that_raises_gives_its_turn_back_as_train_raises(tmp_path: Path) -> None:
    from agent.examples.trl_train.jobs import TrlConfig

    baton, callback = recorded()
    config = TrlConfig(kind="grpo", seed=3, batch=4, group=4, accumulation=1, iterations=1)
    job = watched(callback, config, 3, tmp_path, [callback], None)
    callback.watch(job)  # twice: still one guard
    forwards: list[bool] = []

    def fail_in_the_second_step(module: Any, args: Any) -> None:
        forwards.append(callback.holding)
        if len(baton.events) > 4:  # the first step's acquire and yield were made
            raise RuntimeError("the loss went wrong")

    job.model.register_forward_pre_hook(fail_in_the_second_step)
    with pytest.raises(RuntimeError, match="the loss went wrong"):
        job.train()
    assert all(forwards) and not callback.holding
    assert baton.events[-2:] == ["acquire", "yield"]  # the failed step's turn, given back
    assert baton.events.count("acquire") == baton.events.count("yield")


@needs_trl
@pytest.mark.timeout(120)
def test_without_parking_every_batch_reaches_the_device_inside_a_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `park=False` the driver's checkpoint parks the process, and a device call outside a
    turn blocks until the next restore, which only this process's own acquire brings: the
    trainer's fetch of a step's batches (moved to the device before `on_step_begin`) must be
    inside the turn, or the second step hangs; a collator wrapped off-turn runs in that turn
    rather than handing it back before each batch's move."""
    import accelerate.data_loader

    from agent.client.trl import BatonCallback
    from agent.examples.trl_train.jobs import TrlConfig, deterministic

    deterministic()
    baton = Recorder()
    callback = BatonCallback(baton, park=False)  # type: ignore[arg-type]
    moved: list[bool] = []
    send = accelerate.data_loader.send_to_device

    def recorded_send(*args: Any, **kwargs: Any) -> Any:
        moved.append(callback.holding)
        return send(*args, **kwargs)

    monkeypatch.setattr(accelerate.data_loader, "send_to_device", recorded_send)
    config = TrlConfig(kind="sft", seed=5, batch=4, accumulation=2, off_s=0.001)
    job = watched(callback, config, 3, tmp_path, [callback], callback.off_turn)
    job.train()
    assert len(moved) >= 6 and all(moved)  # two batches a step, three steps
    assert len(callback.turns) == 1 + 3  # the build's, then one a step: the collator ran in it
    assert not callback.holding
    assert baton.events.count("acquire") == baton.events.count("yield")


@needs_trl
@pytest.mark.timeout(120)
def test_an_evaluation_that_is_no_new_best_ends_its_steps_turn(tmp_path: Path) -> None:
    """With `save_strategy="best"` the trainer saves after an evaluation only if it is a new
    best: one that is not must not keep the turn into the next step (or every step while the
    metric stops improving)."""
    from transformers import TrainerCallback
    from transformers.trainer_utils import SaveStrategy

    from agent.examples.trl_train.jobs import TrlConfig

    baton, callback = recorded()
    scores = iter([1.0, 0.5, 0.2, 2.0])  # new bests at the first and the fourth evaluation
    acquires: list[int] = []
    saves: list[int] = []

    class Probe(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            acquires.append(baton.events.count("acquire"))

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            saves.append(state.global_step)

    config = TrlConfig(kind="sft", seed=5, batch=4, eval_steps=1)
    job = watched(callback, config, 4, tmp_path, [Probe(), callback], None)
    job.compute_metrics = lambda prediction: {"score": next(scores)}
    job.args.save_strategy = SaveStrategy.BEST
    job.args.metric_for_best_model, job.args.greater_is_better = "score", True
    job.train()
    assert saves == [1, 4]
    assert len(set(acquires)) == 4  # each step in a turn of its own
    assert baton.events.count("acquire") == baton.events.count("yield") and not callback.holding


@needs_trl
@pytest.mark.timeout(120)
def test_a_trainer_dropped_after_its_training_is_parked_no_more(tmp_path: Path) -> None:
    """An SFT stage, then a GRPO stage with the same callback: once the program drops the SFT
    trainer, its model and optimizer state leave every park (and memory) with it."""
    import gc
    import weakref

    from agent.client.torch import TorchParker
    from agent.examples.trl_train.jobs import TrlConfig

    baton, callback = recorded()
    sft = watched(
        callback, TrlConfig(kind="sft", seed=5, batch=4), 2, tmp_path / "sft", [callback], None
    )
    sft.train()
    dropped = weakref.ref(sft.optimizer)
    config = TrlConfig(kind="grpo", seed=5, batch=4, group=4, beta=0.0)
    grpo = watched(callback, config, 2, tmp_path / "grpo", [callback], None)
    del sft
    gc.collect()
    grpo.train()
    assert dropped() is None
    assert callback.parker is not None
    alone = TorchParker(grpo.model, grpo.optimizer).footprint_bytes()
    assert alone > 0 and callback.parker.footprint_bytes() == alone
    assert baton.events.count("acquire") == baton.events.count("yield")


@needs_trl
@pytest.mark.timeout(120)
def test_a_turn_block_is_held_to_its_end_through_the_trainers_events(tmp_path: Path) -> None:
    """`evaluate()` and `log()` fire `on_log` and `on_evaluate`: inside a `turn()` block they
    must not end the block's turn, or the block's device work after them runs outside one."""
    from agent.examples.trl_train.jobs import TrlConfig

    baton, callback = recorded()
    config = TrlConfig(kind="sft", seed=5, batch=4, eval_steps=2)
    job = watched(callback, config, 2, tmp_path, [callback], None)
    held: list[bool] = []
    with callback.turn():  # a baseline evaluation before training, then a save
        job.evaluate()
        held.append(callback.holding)
        job.log({"baseline": 1.0})
        held.append(callback.holding)
    assert held == [True, True] and not callback.holding
    assert baton.events[-2:] == ["acquire", "yield"]  # one turn for the block
    assert baton.events.count("acquire") == baton.events.count("yield") == 2


@needs_trl
@pytest.mark.timeout(60)
def test_a_collator_run_off_turn_in_forked_dataloader_workers_runs_there(workdir: str) -> None:
    """The workers fork while a turn is held (the first epoch's iterator is made inside the
    training's first turn): their copy of the turn is the parent's, not theirs to give back."""
    import torch
    from torch.utils.data import DataLoader

    from agent.client import Baton
    from agent.client.trl import BatonCallback
    from baton.contract.names import fake_gpu_uuid
    from tests.harness.agent import AgentRunner

    with AgentRunner(workdir) as agent:
        callback = BatonCallback(Baton(agent.socket, [fake_gpu_uuid(0)], name="job"))
        try:
            items: Any = list(range(8))  # a list serves as a map-style dataset
            loader: DataLoader[int] = DataLoader(
                items, batch_size=2, num_workers=2, multiprocessing_context="fork",
                collate_fn=callback.off_turn(torch.tensor),
            )  # fmt: skip
            with callback.turn():
                batches = [batch.tolist() for batch in loader]
                assert callback.holding
            assert batches == [[0, 1], [2, 3], [4, 5], [6, 7]]
            assert len(callback.turns) == 1  # the workers neither gave it back nor took one
        finally:
            callback.close()


@needs_trl
@pytest.mark.timeout(120)
def test_rewards_run_off_turn_keep_the_names_trl_logs_them_under(tmp_path: Path) -> None:
    """TRL names a callable instance's figures after its class and a partial's after its
    function: wrapped with `off_turn` they keep those names, instead of all being 'wrapped',
    so that two such rewards logged their means under one key, the second hiding the first."""
    import functools

    from trl import GRPOConfig, GRPOTrainer

    from agent.examples.trl_train.jobs import TrlConfig, dataset, model, tokenizer

    baton, callback = recorded()

    class Brevity:
        def __call__(self, prompts: list[str], completions: list[str], **_: Any) -> list[float]:
            return [-len(c) / 10 for c in completions]

    def digits(prompts: list[str], completions: list[str], weight: float, **_: Any) -> list[float]:
        return [weight * sum(ch.isdigit() for ch in c) for c in completions]

    config = TrlConfig(kind="grpo", seed=7, batch=4, group=4, beta=0.0)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=4,
        num_generations=4, max_completion_length=5, beta=0.0, use_cpu=True, report_to="none",
        save_strategy="no", disable_tqdm=True, logging_steps=1,
    )  # fmt: skip
    rewards = [Brevity(), functools.partial(digits, weight=0.5)]
    with callback.turn():
        job = GRPOTrainer(
            model=model(config, tmp_path), args=args, train_dataset=dataset(config, 8),
            reward_funcs=[callback.off_turn(r) for r in rewards], processing_class=tokenizer(),
            callbacks=[callback],
        )  # fmt: skip
        callback.watch(job)
    job.train()
    assert job.reward_func_names == ["Brevity", "digits"]
    logged = job.state.log_history[0]
    assert {"rewards/Brevity/mean", "rewards/digits/mean"} <= set(logged)
    assert baton.events.count("acquire") == baton.events.count("yield")
