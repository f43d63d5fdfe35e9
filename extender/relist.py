"""A relist rebuilt off the cache's lock. Pure.

Rebuilding the state from a full list (every pod's request read, every node's state built)
takes seconds in a large cluster; under the cache's lock it stalled every verb that takes the
lock (`/preempt`, a bind, `/filter` with node objects) and, the lock being taken on the event
loop, every request behind them. So the relist is rebuilt on a copy of the state
(`ClusterState.fork`, under the lock: copies of its tables), off the lock, while the verbs go
on answering from the state as it was. Every change made to the state meanwhile (another
kind's watch events, binds assumed, forgotten or left unsure) is journaled by `journaled` and
replayed on the rebuilt copy before it is swapped in, in one step under the lock
(`ClusterState.adopt`): the result is the same as if those changes had come just after the
relist, which they could have, so no slot is counted twice or freed early.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
R = TypeVar("R")
Journal = list[tuple[Callable[..., Any], tuple[Any, ...]]]
"""Changes made to a state, in order: each a function of the state and its arguments."""


class Journaling(Protocol):
    """A state that journals its changes while a fork of it is out (`None`: none is)."""

    journal: Journal | None


S = TypeVar("S", bound=Journaling)


def journaled(change: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """Mark a method that changes the state: while a fork is out, it is journaled to be
    replayed on the fork (`replay`)."""

    @functools.wraps(change)
    def record(state: S, *args: P.args, **kwargs: P.kwargs) -> R:
        if state.journal is not None:
            state.journal.append((functools.partial(change, **kwargs), args))
        return change(state, *args, **kwargs)

    return record


def replay(journal: Journal, fork: Any) -> None:
    """Make on the fork, in order, the changes journaled on the state it was forked from."""
    for change, args in journal:
        change(fork, *args)
