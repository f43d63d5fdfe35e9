"""A tenant that forks while it holds a turn, as a DataLoader with fork workers does.

    python tests/agent/client/fork_tenant.py NAME [Baton|AsyncBaton] [in-turn]

The child tries the parent's client (connect, acquire, yield_), prints what each raised, and
exits the ordinary way, so the interpreter's exit closes its copy of the client (an `AsyncBaton`'s:
`asyncio.run` cancels the copy of its session's task as the child leaves); the parent then
ends its turn and prints "parent yielded", or what its yield raised. With "in-turn" the parent
forks inside `turn()` and the child leaves through the block with `sys.exit(0)`.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable

from agent.client import AsyncBaton, Baton

YIELD_WAIT_S = 10.0
"""Bound on the parent's yield of the async client (its answer is read on the session)."""


def child(baton: Baton) -> int:
    calls = (
        ("connect", baton.connect),
        ("acquire", lambda: baton.acquire(timeout=5)),
        ("yield", baton.yield_),
    )
    for name, call in calls:
        try:
            call()
            print(f"child {name} returned", flush=True)
        except Exception as exc:
            print(f"child {name} raised {type(exc).__name__}: {exc}", flush=True)
    return 0


def main() -> int:
    baton = Baton(name=sys.argv[1], keep_turns=False)
    baton.acquire(timeout=30)
    pid = os.fork()
    if pid == 0:
        sys.exit(child(baton))  # atexit runs here: it must leave the parent's session alone
    _, status = os.waitpid(pid, 0)
    print(f"child exited {os.waitstatus_to_exitcode(status)}", flush=True)
    try:
        baton.yield_()
        print("parent yielded", flush=True)
    except Exception as exc:
        print(f"parent yield raised {type(exc).__name__}: {exc}", flush=True)
    baton.close()
    return 0


def fork_a_child_that_leaves() -> None:
    """Fork a child that leaves with sys.exit(0), through the block the parent is in (the turn
    is the parent's to end); print its exit status."""
    pid = os.fork()
    if pid == 0:
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    print(f"child exited {os.waitstatus_to_exitcode(status)}", flush=True)


def in_turn() -> None:
    baton = Baton(name=sys.argv[1], keep_turns=False)
    with baton.turn(timeout=30):
        fork_a_child_that_leaves()
    print("parent yielded" if baton.lease is None else "parent holds", flush=True)
    baton.close()


async def async_in_turn() -> None:
    baton = AsyncBaton(name=sys.argv[1], keep_turns=False)
    async with baton.turn(timeout=30):
        fork_a_child_that_leaves()
    print("parent yielded" if baton.lease is None else "parent holds", flush=True)
    await baton.close()


async def async_child(baton: AsyncBaton) -> None:
    calls: tuple[tuple[str, Callable[[], Awaitable[object]]], ...] = (
        ("connect", baton.connect),
        ("acquire", lambda: baton.acquire(timeout=5)),
        ("yield", baton.yield_),
    )
    for name, call in calls:
        try:
            await call()
            print(f"child {name} returned", flush=True)
        except Exception as exc:
            print(f"child {name} raised {type(exc).__name__}: {exc}", flush=True)


async def async_main() -> None:
    baton = AsyncBaton(name=sys.argv[1], keep_turns=False)
    await baton.acquire(timeout=30)
    pid = os.fork()
    if pid == 0:
        await async_child(baton)
        sys.exit(0)  # asyncio.run's cleanup runs here: it must leave the parent's session alone
    _, status = os.waitpid(pid, 0)
    print(f"child exited {os.waitstatus_to_exitcode(status)}", flush=True)
    try:
        await asyncio.wait_for(baton.yield_(), YIELD_WAIT_S)
        print("parent yielded", flush=True)
    except Exception as exc:
        print(f"parent yield raised {type(exc).__name__}: {exc!r}", flush=True)
    await baton.close()


if __name__ == "__main__":
    asynchronous, turn = "AsyncBaton" in sys.argv[2:], "in-turn" in sys.argv[2:]
    if asynchronous:
        asyncio.run(async_in_turn() if turn else async_main())
        sys.exit(0)
    if turn:
        in_turn()
        sys.exit(0)
    sys.exit(main())
