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
(`pip install 'baton-gpu[trl]'`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from agent.client.errors import BatonError
from agent.client.off_turn import OffTurn
from agent.client.sync import Baton
from agent.client.torch import TorchParker, tensors_of
from agent.client.trl_events import BEGINS_TURN, MAY_END_TURN, device_work_follows

log = logging.getLogger("baton.client")

F = TypeVar("F", bound=Callable[..., Any])

WEAKLY_PARKED = (torch.nn.Module, torch.optim.Optimizer, torch.Tensor)
"""What `watch` parks only while the program keeps it."""
OUTSIDE_STEPS = ("evaluate", "predict", "save_model")
"""A watched trainer's methods that run in a turn when called outside one."""


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
        self._held_by = 0
        """The process that took the turn held (a forked DataLoader worker has a copy of it)."""
        self._watched: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        """The modules, optimizers and tensors `watch` registered, by id, while they live."""
        self._kept: set[int] = set()
        """The other sources it registered (lists, dicts, functions), which the parker keeps."""
        self._wired = False
        """True once a trainer's callback handler takes and ends the turns (`watch`)."""
        self._dispatching = 0
        self._fetching = False
        """True while a trainer without parking fetches a step's batches inside its turn."""
        self._pinned = 0
        """Open `turn()` blocks that took their turn: the trainer's events end none of it."""
        self._in_step = False
        """True from a step's `on_step_begin` to its `on_step_end`: a `trainer.log()` from the
        step's loss or reward (its `on_log`) ends nothing."""
        self._closed = False
        """True after `close()`: the process shares the GPU no more, and takes no turns."""
        self._off_turn = OffTurn(self._hand_back, self.begin)

    @property
    def holding(self) -> bool:
        """True while this callback holds a turn."""
        return self._held is not None

    def begin(self) -> None:
        """Acquire a turn unless one is held or the callback is closed (and hold parks off while
        it is). Interrupted (Ctrl-C) or failing once the grant came, before the turn is
        recorded, it gives the turn back, which no later `end()` would."""
        if self._held is not None or self._closed:
            return
        stack = contextlib.ExitStack()
        requested, pid = time.time(), os.getpid()
        already = self.baton.lease  # held before (the user's own acquire): not this call's
        try:
            lease = self.baton.acquire(self.acquire_timeout)
            if self.parker is not None:
                stack.enter_context(self.parker.in_use())
            self.turns.append([lease.lease_id, requested, time.time(), 0.0])
            self._held, self._held_by = stack, pid
        except BaseException:
            stack.close()
            if already is None and self.baton.lease is not None:
                with contextlib.suppress(BatonError):  # the interrupt is the one to see
                    self.baton.yield_()
            raise

    def end(self) -> None:
        """Hand the turn back, if one is held."""
        if self._stop_holding():
            self.baton.yield_()

    def _stop_holding(self) -> bool:
        """End the device work of the turn held, if one is, without yielding it; True if one
        was."""
        held, self._held = self._held, None
        if held is None:
            return False
        self.turns[-1][3] = time.time()  # the device work ended: the yield is the handover's
        held.close()
        return True

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """A turn for device work outside the training loop (building the trainer, evaluating,
        saving), held until the block ends: the events of a trainer called inside it (the
        `on_log` and `on_evaluate` of an `evaluate()`) do not end it."""
        if self._held is not None or self._closed:
            yield
            return
        self.begin()
        self._pinned += 1
        try:
            yield
        finally:
            self._pinned -= 1
            self.end()

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
        ends after its last, so the order of the callbacks does not matter."""
        if getattr(handler, "_baton_turns", None) is self:
            return
        dispatch = handler.call_event

        def call_event(
            event: str, args: TrainingArguments, state: TrainerState, control: TrainerControl,
            **kw: Any,
        ) -> TrainerControl:  # fmt: skip
            if event in BEGINS_TURN:
                self.begin()
            self._dispatching += 1  # an event raised inside another's callback ends nothing
            try:
                control = dispatch(event, args, state, control, **kw)
            finally:
                self._dispatching -= 1
            self._step_event(event)
            last = self._dispatching == 0 and not self._pinned and not self._in_step
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
        that raises fires no later event); `evaluate`, `predict` and `save_model` called
        outside a turn take one for their whole call. Without parking, a step's turn begins
        as its batches are fetched (they reach the device before `on_step_begin`)."""
        train = trainer.train
        if getattr(train, "_baton_turns", None) is self:
            return

        @functools.wraps(train)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            self._in_step = False  # a step that raised never reached its on_step_end
            try:
                self.begin()
                return train(*args, **kwargs)
            except BaseException:
                with contextlib.suppress(BatonError):  # the step's own error is the one to see
                    self.end()
                raise

        guarded._baton_turns = self  # type: ignore[attr-defined]
        trainer.train = guarded
        for name in OUTSIDE_STEPS:
            setattr(trainer, name, self._in_turn(getattr(trainer, name)))
        if self.parker is None:  # the driver's checkpoint: every device call needs the turn
            trainer.get_batch_samples = self._begins(trainer.get_batch_samples)

    def _step_event(self, event: str) -> None:
        """Note a step's begin and end: between them no event ends the step's turn."""
        if event == "on_step_begin":
            self._in_step = True
        elif event == "on_step_end":
            self._in_step = False

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

    def _in_turn(self, method: F) -> F:
        """`method` run inside a turn: the one held, or one taken for its call."""

        @functools.wraps(method)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with self.turn():
                return method(*args, **kwargs)

        return wrapped  # type: ignore[return-value]

    def off_turn(self, fn: F) -> F:
        """Wrap a plain-Python reward function, `async` or not (or a data collator), so the GPU
        goes to another job while it runs; overlapping calls hand the turn back once. In a
        forked DataLoader worker it just runs: the turn is the parent's; so does a collator
        without parking (`park=False`), inside the turn of the batch fetch."""
        return self._off_turn.wrap(fn)

    def _hand_back(self) -> bool:
        """End the turn held for an off-turn call; False if there is none this process may
        hand back (a worker's copy, or the batch fetch's turn without parking)."""
        if self._held is None or self._held_by != os.getpid() or self._fetching:
            return False
        self.end()
        return True

    def close(self) -> None:
        """Leave the agent: what the parker holds parked comes back first, in one last turn
        (the one held, or one taken for it), and the session ends inside that turn, so nothing
        is parked again and the models are whole on the device after it. From then on the
        callback takes no turns: the watched trainer's methods and events run as plain calls.
        A park the agent asked for meanwhile (another job's turn needs the room) finishes
        first, and what it parked comes back in that last turn too. An acquire that fails (its
        timeout, the agent gone) raises after the session ended, the memory still parked."""
        if self._closed:
            return
        self._closed = True
        parker = self.parker
        try:
            self._stop_holding()
            if parker is not None and self.baton.close_unless(lambda: parker.parked):
                self.baton.acquire(self.acquire_timeout)  # its grant restores the parker
        finally:
            self.baton.close()

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
        if not self._wired and device_work_follows("on_epoch_end", args, control):
            self.begin()  # the epoch's logging, evaluation or saving touch the device
        self._end_unless("on_epoch_end", args, control)

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._end_unless("on_log", args, control)

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._end_unless("on_evaluate", args, control, state, kw.get("metrics"))

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._end_unless("on_save", args, control)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._end_unless("on_train_end", args, control)

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
