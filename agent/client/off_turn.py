"""Functions run with the turn handed back (`BatonCallback.off_turn`): a reward that calls a
remote verifier, a slow collator. Plain and `async` functions alike; calls that overlap (an
`async` reward gathered beside another, a reward checking completions on several threads) hand
the turn back once, and the last of them to finish takes it again, unless one of them raised: an
error or an interrupt (Ctrl-C) leaves at once, without waiting for the turn."""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class OffTurn:
    """Wraps functions to run off-turn: `hand_back()` ends the turn held (False if there is
    none this process may hand back) and `take_again()` waits for the next one."""

    def __init__(self, hand_back: Callable[[], bool], take_again: Callable[[], None]) -> None:
        self._hand_back = hand_back
        self._take_again = take_again
        self._lock = threading.Lock()
        self._away = 0
        """Off-turn calls running on a turn handed back."""
        self._raised = False
        """True once one of them raised: the last to end takes no turn again."""
        self._together: _Together | None = None
        """Inside `together()`: the plain functions called one after another, run at once."""

    def wrap(self, fn: F) -> F:
        """`fn` run with the turn handed back; an `async` function stays one (TRL awaits it)."""
        if is_async(fn):

            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with self._away_from_turn():
                    return await fn(*args, **kwargs)

            return _named(run_async, fn)  # type: ignore[return-value]

        def run(*args: Any, **kwargs: Any) -> Any:
            together = self._together
            if together is not None and run in together.fns:
                return together.result(run, args, kwargs)
            with self._away_from_turn():
                return fn(*args, **kwargs)

        named = _named(run, fn)
        named._baton_off_turn = (self, fn)  # type: ignore[attr-defined]
        return named  # type: ignore[return-value]

    @contextlib.contextmanager
    def together(self, fns: Iterable[Any]) -> Iterator[None]:
        """Inside: the plain functions wrapped here among `fns` (TRL's reward functions, which
        it calls one after another with the same arguments) all run at the first one's call,
        in one hand-back, each later call answered with its result: rather than a handover
        (a restore and a park, with another job waiting) between each two of them."""
        plain: dict[Any, Callable[..., Any]] = {}
        for fn in fns:
            marked: tuple[OffTurn, Callable[..., Any]] | None = getattr(fn, "_baton_off_turn", None)
            if marked is not None and marked[0] is self:
                plain[fn] = marked[1]
        if len(plain) < 2:
            yield
            return
        outer, self._together = self._together, _Together(self, plain)
        try:
            yield
        finally:
            self._together = outer

    @contextlib.contextmanager
    def _away_from_turn(self) -> Iterator[None]:
        """One call's time off the turn: handed back as it starts (unless there is none to
        hand back: it just runs), taken again as the last overlapping call ends, unless one
        raised: its error leaves `train()` (TRL catches none), and waiting for the turn, up to
        another job's whole turn, would only delay it."""
        if not self._leave():
            yield
            return
        try:
            yield
        except BaseException:
            self._come_back(raised=True)
            raise
        self._come_back()

    def _leave(self) -> bool:
        """Hand the turn back for a call, unless an overlapping call did; False if there was
        no turn to hand back (the call just runs)."""
        with self._lock:
            if self._away:
                self._away += 1
                return True
            if not self._hand_back():
                return False
            self._away = 1
            return True

    def _come_back(self, raised: bool = False) -> None:
        """A call ended: the last of the overlapping calls takes the turn again, unless one of
        them `raised` (an error, a KeyboardInterrupt): the job does not wait for a turn only
        to give it back."""
        with self._lock:
            self._away -= 1
            self._raised = self._raised or raised
            if self._away:
                return
            raised, self._raised = self._raised, False
            if not raised:
                self._take_again()


class _Together:
    """The plain functions of one `OffTurn.together()` block and their results."""

    def __init__(self, off_turn: OffTurn, fns: dict[Any, Callable[..., Any]]) -> None:
        self.off_turn = off_turn
        self.fns = fns
        """Each wrapper, and the function it wraps, in the order they are called."""
        self.results: dict[Any, Any] | None = None
        self.running = False
        """True while they run, at the first call."""
        self.args: tuple[tuple[Any, ...], dict[str, Any]] = ((), {})

    def result(self, wrapper: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The wrapper's result: at the first call, every function run in one hand-back; a
        call with other arguments (or a second call) runs on its own, and one from inside
        another of them runs as it is (off-turn already)."""
        if self.running:  # one of them calls another: the turn is handed back already
            return self.fns[wrapper](*args, **kwargs)
        if self.results is None:
            self.args, self.running = (args, kwargs), True
            try:
                with self.off_turn._away_from_turn():
                    self.results = {w: fn(*args, **kwargs) for w, fn in self.fns.items()}
            finally:
                self.running = False
        elif wrapper not in self.results or not _same(self.args, (args, kwargs)):
            with self.off_turn._away_from_turn():
                return self.fns[wrapper](*args, **kwargs)
        return self.results.pop(wrapper)


def _same(
    one: tuple[tuple[Any, ...], dict[str, Any]], other: tuple[tuple[Any, ...], dict[str, Any]]
) -> bool:
    """Whether two calls got the very same arguments (the same objects)."""
    (args, kwargs), (args2, kwargs2) = one, other
    same_args = len(args) == len(args2) and all(a is b for a, b in zip(args, args2, strict=False))
    return (
        same_args
        and kwargs.keys() == kwargs2.keys()
        and all(kwargs[k] is kwargs2[k] for k in kwargs)
    )


def is_async(fn: Any) -> bool:
    """Whether calling `fn` returns a coroutine: an `async def`, a partial of one, or an
    instance whose `__call__` is one (as TRL tells an async reward function)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    call = getattr(fn, "__call__", None)  # noqa: B004 (the method itself is inspected)
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def name_of(fn: Any) -> str:
    """The name TRL logs a reward function's figures under: a partial's function's, a callable
    instance's class's."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return str(getattr(fn, "__name__", type(fn).__name__))


def _named(wrapper: Callable[..., Any], fn: Any) -> Callable[..., Any]:
    """`wrapper` with `fn`'s module and docs (`functools.wraps`) and the name TRL gives `fn`."""
    named = functools.wraps(fn)(wrapper)
    named.__name__ = named.__qualname__ = name_of(fn)
    return named
