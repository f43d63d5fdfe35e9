"""Work that must run to its end once started, whatever cancels the one waiting for it."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def to_the_end(*tasks: asyncio.Future[Any]) -> None:
    """Wait until every one of `tasks` has ended, whatever cancels this wait: a clean-up that
    gives back what a cancelled call was granted must not be cut short by a second cancel (a
    timeout, then a shutdown; a call's cancel, then its release's). Their outcomes are left to
    the caller to read."""
    while not all(task.done() for task in tasks):
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait(tasks)
