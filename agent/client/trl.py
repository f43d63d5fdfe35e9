"""Takes Baton turns inside a transformers/TRL `Trainer`: one callback, and slow rewards off-turn.

    from agent.client.trl import BatonCallback

    baton = BatonCallback()                 # Baton() from the environment, parks via TorchParker
    with baton.turn():                      # the trainer places the model inside a turn
        trainer = GRPOTrainer(..., reward_funcs=[baton.off_turn(verify)], callbacks=[baton])
        baton.watch(trainer)                # park its model and reference model too
    trainer.train()                         # one turn per optimizer step
    with baton.turn():
        trainer.save_model(out)

A turn starts at `on_step_begin` (generation, rewards, reference log-probs, forward/backward and
the optimizer step all fall inside) and ends after the step's device work: at `on_step_end`, or
after the logging, evaluation and saving the step's control asks for, or at `on_train_end` after
the last step. Needs transformers (`pip install 'baton-gpu[trl]'`).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from agent.client.sync import Baton
from agent.client.torch import TorchParker

F = TypeVar("F", bound=Callable[..., Any])


class BatonCallback(TrainerCallback):
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
        self.parker = TorchParker() if park else None
        if baton is None:
            baton = Baton()
        if self.parker is not None:
            baton.register_callbacks(self.parker.park, self.parker.restore)
        self.baton = baton
        self.acquire_timeout = acquire_timeout
        self.turns: list[list[Any]] = []
        self._held: contextlib.ExitStack | None = None
        self._watched: set[int] = set()

    @property
    def holding(self) -> bool:
        """True while this callback holds a turn."""
        return self._held is not None

    def begin(self) -> None:
        """Acquire a turn unless one is held (and hold parks off while it is)."""
        if self._held is not None:
            return
        stack = contextlib.ExitStack()
        requested = time.time()
        lease = self.baton.acquire(self.acquire_timeout)
        stack.callback(self.baton.yield_)
        if self.parker is not None:
            stack.enter_context(self.parker.in_use())
        self.turns.append([lease.lease_id, requested, time.time(), 0.0])
        self._held = stack

    def end(self) -> None:
        """Hand the turn back, if one is held."""
        held, self._held = self._held, None
        if held is not None:
            held.close()
            self.turns[-1][3] = time.time()

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """A turn for device work outside the training loop (building the trainer, saving)."""
        if self._held is not None:
            yield
            return
        self.begin()
        try:
            yield
        finally:
            self.end()

    def watch(self, *sources: Any) -> None:
        """Park these too: a `Trainer` (its model and any `ref_model`), modules, optimizers."""
        if self.parker is None:
            return
        for source in sources:
            found = (
                [source.model, getattr(source, "ref_model", None)]
                if _is_trainer(source)
                else [source]
            )
            for item in found:
                if item is not None and id(item) not in self._watched:
                    self._watched.add(id(item))
                    self.parker.add(item)

    def off_turn(self, fn: F) -> F:
        """Wrap a plain-Python reward function so the GPU goes to another job while it runs."""

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if self._held is None:
                return fn(*args, **kwargs)
            self.end()
            try:
                return fn(*args, **kwargs)
            finally:
                self.begin()

        return wrapped  # type: ignore[return-value]

    def close(self) -> None:
        """End any turn and the session with the agent."""
        self.end()
        self.baton.close()

    # The trainer's hooks.

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.begin()
        self.watch(*(kw[k] for k in ("model", "optimizer") if kw.get(k) is not None))

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.begin()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._end_unless(control, log=True)

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if control.should_log or control.should_evaluate or control.should_save:
            self.begin()  # the epoch's logging, evaluation or saving touch the device
        self._end_unless(control, log=True)

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._end_unless(control, log=False)

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._end_unless(control, log=False)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._end_unless(control, log=False)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.end()

    def _end_unless(self, control: TrainerControl, *, log: bool) -> None:
        """End the turn unless device work follows: logging (`.item()` on the loss), evaluation,
        saving, or the end of training (the final loss read, the best model loaded)."""
        more = control.should_evaluate or control.should_save or control.should_training_stop
        if not (more or (log and control.should_log)):
            self.end()


def _is_trainer(source: Any) -> bool:
    """True for a transformers `Trainer` (anything with a `model` and a `callback_handler`)."""
    return hasattr(source, "callback_handler") and hasattr(source, "model")
