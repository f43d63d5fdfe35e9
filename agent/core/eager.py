"""Run a coroutine eagerly: up to its first suspension now, the rest as a task if needed.

Making room before a turn usually finishes without waiting (nothing to move); running it
eagerly grants the turn in the same event-loop step as the yield that freed the GPU.
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Rest(Generic[T]):
    """The remainder of a coroutine suspended once already; await it (or wrap it in a task)."""

    def __init__(self, coro: Coroutine[Any, Any, T], pending: Any) -> None:
        self._coro = coro
        self._pending = pending

    def __await__(self) -> Generator[Any, None, T]:
        pending = self._pending
        while True:
            try:
                yield pending
            except BaseException as exc:  # cancellation and the like go to the coroutine
                try:
                    pending = self._coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
                continue
            try:
                pending = self._coro.send(None)
            except StopIteration as stop:
                return stop.value


def start(coro: Coroutine[Any, Any, T]) -> tuple[bool, T | None, Rest[T] | None]:
    """(finished, result, rest): raises at once what the coroutine raises before suspending."""
    try:
        pending = coro.send(None)
    except StopIteration as stop:
        return True, stop.value, None
    return False, None, Rest(coro, pending)
