"""Running the extender's (asynchronous) bind from a synchronous test."""

from __future__ import annotations

import asyncio

from extender.bind import Binder
from extender.wire import BindingArgs


def bind_once(binder: Binder, args: BindingArgs) -> str:
    """One bind on an event loop of its own, its API connections closed before the loop ends."""

    async def once() -> str:
        try:
            return await binder.bind(args)
        finally:
            binder.close()

    return asyncio.run(once())
