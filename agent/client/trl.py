"""Takes Baton turns inside a transformers/TRL `Trainer`: one callback, and slow rewards off-turn.

    from agent.client.trl import BatonCallback

    baton = BatonCallback()                 # Baton() from the environment, parks via TorchParker
    with baton.turn():                      # the trainer places the model inside a turn
        trainer = GRPOTrainer(..., reward_funcs=[baton.off_turn(verify)], callbacks=[baton])
        baton.watch(trainer)                # its callbacks and models (policy, ref, reward)
    trainer.train()                         # one turn per optimizer step
    with baton.turn():
        trainer.save_model(out)

`watch(trainer)` wraps the trainer's callback handler: a step's turn begins before the first
callback of `on_step_begin` and ends after the last callback of the step's last event
(`on_step_end`, or the logging, evaluation and saving the step's control asks for, or
`on_train_end` after the last step), whatever the callbacks' order, so TRL's own callbacks
(`SyncRefModelCallback`) and the user's run inside it; a step that raises gives its turn back as
the exception leaves `trainer.train()`. `train()` takes its turn as it starts (it loads a
checkpoint it resumes from before any event), and `evaluate()`, `predict()` and `save_model()`
called outside a turn take one. Needs transformers
(`pip install 'baton-gpu[trl]'`). The turn itself (begin, end, `turn()`, off-turn calls,
`close()`) is held by `agent.client.trl_turns.TurnHolder`; which events begin and end it is
decided in `agent.client.trl_events`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from agent.client.errors import BatonError
from agent.client.sync import Baton
from agent.client.torch import TorchParker, tensors_of
from agent.client.trl_events import BEGINS_TURN, MAY_END_TURN, device_work_follows
from agent.client.trl_turns import TurnHolder

log = logging.getLogger("baton.client")

F = TypeVar("F", bound=Callable[..., Any])

WEAKLY_PARKED = (torch.nn.Module, torch.optim.Optimizer, torch.Tensor)
"""What `watch` parks only while the program keeps it."""
OUTSIDE_STEPS = ("evaluate", "predict", "save_model")
"""A watched trainer's methods that run in a turn when called outside one."""


class BatonCallback(TurnHolder, TrainerCallback):
    """Holds a Baton turn around each training step's device work; parks through TorchParker.

    `park=False` leaves parking to the agent (the `cuda` backend: the driver's checkpoint).
    `turns` records each turn as [lease id, requested, granted, yielded] (wall-clock seconds).
    """

    def __init__(
        self,
        baton: Baton | None = None,
        *,
        park: bool = True,
        acquire_timeout: float | None = None,
    ) -> None:
        super().__init__(baton, park=park, acquire_timeout=acquire_timeout)
        self._watched: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        """The modules, optimizers and tensors `watch` registered, by id, while they live."""
        self._kept: set[int] = set()
        """The other sources it registered (lists, dicts, functions), which the parker keeps."""
        self._wired = False
        """True once a trainer's callback handler takes and ends the turns (`watch`)."""
        self._dispatching = 0
        self._in_step = False
        """True from a step's `on_step_begin` to its `on_step_end`: a `trainer.log()` from the
        step's loss or reward (its `on_log`) ends nothing."""
        self._evaluating = 0
        """Open `evaluate()` calls: an evaluation's `on_log` and `on_evaluate` end nothing (with
        a dict of eval datasets, each dataset's follows), the outermost call's return may."""
        self._epoch_end_due = False
        """Watched: from an epoch's last step's `on_step_end` to the epoch's `on_epoch_end`."""
        self._evaluated_turn = 0
        """Unwired: the turn (its number in `turns`) an evaluation kept, for the datasets that
        may follow it, until the next step begins."""

    def watch(self, *sources: Any) -> None:
        """Take the turns around a `Trainer`'s callbacks, and park its model, any reference
        or teacher model and its reward models; park modules and optimizers given too. Each is
        parked while the program keeps it: a trainer dropped after its training (an SFT stage
        before GRPO) takes its optimizer and models out of the parks."""
        for source in sources:
            trainer = _is_trainer(source)
            if trainer:
                self._wire(source.callback_handler)
                self._guard(source)
            if self.parker is None:
                continue
            for item in _trainer_models(source) if trainer else [source]:
                self._park_while_kept(self.parker, item)

    def _park_while_kept(self, parker: TorchParker, item: Any) -> None:
        """Register `item` with the parker once, through a weak reference where it has one."""
        if self._watched.get(id(item)) is item or id(item) in self._kept:
            return
        if not isinstance(item, WEAKLY_PARKED):
            parker.add(item)
            self._kept.add(id(item))
            return
        parker.add(functools.partial(_tensors_while_kept, weakref.ref(item)))
        self._watched[id(item)] = item

    def _wire(self, handler: Any) -> None:
        """Wrap the handler's dispatch: the turn begins before an event's first callback and
        ends after its last, so the order of the callbacks does not matter; at
        `on_train_begin` the model and optimizer `train()` built are parked too, whether or not
        the trainer lists this callback."""
        if getattr(handler, "_baton_turns", None) is self:
            return
        dispatch = handler.call_event

        def call_event(
            event: str, args: TrainingArguments, state: TrainerState, control: TrainerControl,
            **kw: Any,
        ) -> TrainerControl:  # fmt: skip
            if event in BEGINS_TURN:
                self.begin()
            if event == "on_train_begin":  # what train() built (the optimizer), listed or not
                self.watch(*(x for x in (handler.model, handler.optimizer) if x is not None))
            self._dispatching += 1  # an event raised inside another's callback ends nothing
            try:
                control = dispatch(event, args, state, control, **kw)
            finally:
                self._dispatching -= 1
            self._step_event(event, state)
            last = self._dispatching == 0 and not self._pinned and not self._in_step
            last = last and not (event in ("on_log", "on_evaluate") and self._evaluating)
            last = last and not (self._epoch_end_due and event != "on_train_end")
            metrics = kw.get("metrics")
            if (
                last
                and event in MAY_END_TURN
                and not device_work_follows(event, args, control, state, metrics)
            ):
                self.end()
            return control

        handler.call_event = call_event
        handler._baton_turns = self
        self._wired = True

    def _guard(self, trainer: Any) -> None:
        """Wrap the trainer's device work outside its steps' events in turns: `train` takes
        its turn on entry (a checkpoint it resumes from is loaded, the model prepared, before
        `on_train_begin`) and gives back a turn still held as an exception leaves it (a step
        that raises fires no later event), unless a `turn()` block holds it; `evaluate`,
        `predict` and `save_model` called outside a turn take one for their whole call.
        Without parking, a step's turn begins as its batches are fetched (they reach the
        device before `on_step_begin`)."""
        train = trainer.train
        if getattr(train, "_baton_turns", None) is self:
            return

        @functools.wraps(train)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            self._in_step = False  # a step that raised never reached its on_step_end
            self._epoch_end_due = False  # nor its epoch's end
            try:
                self.begin()
                return train(*args, **kwargs)
            except BaseException:
                if not self._pinned:  # a `turn()` block's turn is the block's to end
                    with contextlib.suppress(BatonError):  # the step's error is the one to see
                        self.end()
                raise

        guarded._baton_turns = self  # type: ignore[attr-defined]
        trainer.train = guarded
        for name in OUTSIDE_STEPS:
            setattr(trainer, name, self._in_turn(getattr(trainer, name), name == "evaluate"))
        trainer.evaluate = self._ends_evaluation(trainer, trainer.evaluate)
        calculate = getattr(trainer, "_calculate_rewards", None)
        if calculate is not None:  # GRPO, RLOO: its plain rewards run off-turn run together
            trainer._calculate_rewards = self._rewards_together(trainer, calculate)
        if self.parker is None:  # the driver's checkpoint: every device call needs the turn
            trainer.get_batch_samples = self._begins(trainer.get_batch_samples)

    def _rewards_together(self, trainer: Any, calculate: F) -> F:
        """`calculate` (a step's rewards) in which the plain rewards run off-turn hand the turn
        back once, together, rather than once each (`OffTurn.together`)."""

        @functools.wraps(calculate)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with self._off_turn.together(getattr(trainer, "reward_funcs", None) or ()):
                return calculate(*args, **kwargs)

        return wrapped  # type: ignore[return-value]

    def _step_event(self, event: str, state: TrainerState | None = None) -> None:
        """Note a step's begin and end: between them no event ends the step's turn. An epoch's
        end ends a step the loop left before its `on_step_end` (a callback's
        `should_training_stop` at `on_step_begin`, `should_epoch_stop` at `on_substep_end`).
        Given the `state`, an epoch's last step keeps its turn (its logging, evaluation and
        saving end nothing) for the epoch's end, which takes one for its callbacks: its
        `state.epoch` is whole (transformers counts `epoch + (step + 1) / steps_in_epoch`)."""
        if event == "on_step_begin":
            self._in_step = True
        elif event in ("on_step_end", "on_epoch_end"):
            self._in_step = False
        epoch = state.epoch if state is not None else None
        if event == "on_step_end":
            self._epoch_end_due = epoch is not None and float(epoch).is_integer()
        elif event in ("on_step_begin", "on_epoch_end"):
            self._epoch_end_due = False

    def _begins(self, method: F) -> F:
        """`method` run after the turn begins, left held for the step that follows: the
        trainer fetches a step's batches, moving them to the device, before `on_step_begin`."""

        @functools.wraps(method)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.begin()
            self._fetching = True  # each batch reaches the device right after its collation
            try:
                return method(*args, **kwargs)
            finally:
                self._fetching = False

        return wrapped  # type: ignore[return-value]

    def _in_turn(self, method: F, evaluates: bool = False) -> F:
        """`method` run inside a turn: the one held, or one taken for its call; an `evaluates`
        method's `on_log` ends no turn (its `on_evaluate` follows)."""

        @functools.wraps(method)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self._evaluating += evaluates
            try:
                with self.turn():
                    return method(*args, **kwargs)
            finally:
                self._evaluating -= evaluates

        return wrapped  # type: ignore[return-value]

    def _ends_evaluation(self, trainer: Any, evaluate: F) -> F:
        """`evaluate` that ends the turn as its outermost call returns, where its last
        `on_evaluate` would have: after every dataset of a dict of eval datasets, not the first
        (transformers fires `on_evaluate` once per dataset)."""

        @functools.wraps(evaluate)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            metrics = evaluate(*args, **kwargs)
            last = not (self._evaluating or self._dispatching or self._pinned or self._in_step)
            last = last and not self._epoch_end_due
            control, state = trainer.control, trainer.state
            if last and not device_work_follows(
                "on_evaluate", trainer.args, control, state, metrics
            ):
                self.end()
            return metrics

        return wrapped  # type: ignore[return-value]

    # The trainer's hooks: with `watch(trainer)` the wrapped handler takes the turns instead.

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if not self._wired:
            log.warning(
                "BatonCallback: call watch(trainer) before train(); until then callbacks after "
                "BatonCallback's (TRL's SyncRefModelCallback among them) run outside the turn"
            )
            self.begin()
        self.watch(*(kw[k] for k in ("model", "optimizer") if kw.get(k) is not None))

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if not self._wired:
            if self._evaluation_kept():
                self.end()  # the evaluation's turn, kept in case another dataset followed
            self.begin()
            self._step_event("on_step_begin")

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if not self._wired:
            self._step_event("on_step_end")
        self._end_unless("on_step_end", args, control)

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if not self._wired:
            self._step_event("on_epoch_end")
            if device_work_follows("on_epoch_end", args, control):
                self.begin()  # the epoch's logging, evaluation or saving touch the device
        self._end_unless("on_epoch_end", args, control)

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._end_unless("on_log", args, control)

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self._wired or self._pinned or self._in_step or not self.holding:
            return
        # Another dataset's evaluation may follow (a dict of eval datasets): the turn ends as
        # the next step begins, or at the saving, epoch's end or training's end that follow.
        self._evaluated_turn = len(self.turns)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._end_unless("on_save", args, control)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._end_unless("on_train_end", args, control)

    def _evaluation_kept(self) -> bool:
        """Unwired: whether the turn held is the one an evaluation kept."""
        return self.holding and len(self.turns) == self._evaluated_turn

    def _end_unless(
        self,
        event: str,
        args: TrainingArguments,
        control: TrainerControl,
        state: TrainerState | None = None,
        metrics: dict[str, float] | None = None,
    ) -> None:
        """Unwired: end the turn at this callback unless device work follows."""
        if self._wired or self._pinned or self._in_step:
            return
        if event == "on_log" and self._evaluation_kept():
            return  # the next dataset's evaluation logs its metrics
        if not device_work_follows(event, args, control, state, metrics):
            self.end()


def _trainer_models(trainer: Any) -> list[torch.nn.Module]:
    """The models a trainer keeps on the device: the policy, a reference or teacher model, and
    the reward models among GRPO's and RLOO's `reward_funcs`."""
    found = [getattr(trainer, name, None) for name in ("model", "ref_model", "teacher_model")]
    found += list(getattr(trainer, "reward_funcs", None) or [])
    return [item for item in found if isinstance(item, torch.nn.Module)]


def _tensors_while_kept(ref: weakref.ref[Any]) -> Iterable[Any]:
    """The tensors of what `ref` refers to, none once the program dropped it."""
    item = ref()
    return () if item is None else tensors_of(item)


def _is_trainer(source: Any) -> bool:
    """True for a transformers `Trainer` (anything with a `model` and a `callback_handler`)."""
    return hasattr(source, "callback_handler") and hasattr(source, "model")
