"""Which of a transformers `Trainer`'s events begin a Baton turn, and after which it may end:
the rules `BatonCallback` (agent.client.trl) applies around the trainer's callbacks."""

from __future__ import annotations

from transformers import TrainerControl, TrainerState, TrainingArguments

BEGINS_TURN = frozenset({"on_train_begin", "on_step_begin", "on_epoch_end"})
"""Events whose callbacks all run inside a turn, taken before the first of them."""
MAY_END_TURN = frozenset(
    {"on_step_end", "on_log", "on_evaluate", "on_save", "on_epoch_end", "on_train_end"}
)
"""Events after whose last callback the turn ends, unless device work follows."""


def device_work_follows(
    event: str,
    args: TrainingArguments,
    control: TrainerControl,
    state: TrainerState | None = None,
    metrics: dict[str, float] | None = None,
) -> bool:
    """Whether the trainer touches the device after `event`'s callbacks before the next step:
    logging (`.item()` on the loss), evaluation, saving, or the end of training (the final loss
    read, the best model loaded); after an evaluation a `save_strategy="best"` saves if its
    `metrics` are a new best."""
    if event == "on_train_end":
        return False
    if control.should_evaluate or control.should_save or control.should_training_stop:
        return True
    if event in ("on_step_end", "on_epoch_end") and control.should_log:
        return True
    saves_best = event == "on_evaluate" and args.save_strategy == "best"
    return saves_best and new_best(args, state, metrics)


def new_best(
    args: TrainingArguments, state: TrainerState | None, metrics: dict[str, float] | None
) -> bool:
    """Whether the trainer finds `metrics` a new best (`metric_for_best_model` better than the
    state's best metric), as it decides after `on_evaluate` whether a `"best"` strategy saves;
    True when it cannot tell (the trainer raises naming a metric that is missing)."""
    if args.metric_for_best_model is None:
        return False
    name = args.metric_for_best_model
    value = (metrics or {}).get(name if name.startswith("eval_") else f"eval_{name}")
    best = state.best_metric if state is not None else None
    if value is None or best is None:
        return True
    return bool(value > best if args.greater_is_better else value < best)
