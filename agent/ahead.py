"""Restore-ahead: tell the residency layer which waiter is due next on each held GPU.

While a holder runs, the preparer can park an idle tenant and restore the next waiter, so that
the grant after the holder's yield moves nothing. Hints never wait and never fail a grant.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from agent import eager
from agent.leases import LeaseTable, Waiter
from agent.residency import TurnPreparer

log = logging.getLogger(__name__)


class LookAhead:
    """Names each held GPU's next waiter to the preparer, once per waiter."""

    def __init__(
        self, preparer: TurnPreparer, spawn: Callable[[Coroutine[Any, Any, None]], None]
    ) -> None:
        self._preparer = preparer
        self._spawn = spawn
        self._hinted: set[str] = set()

    def look(self, table: LeaseTable) -> None:
        """Hint the waiters now due next that were not hinted before."""
        self._hinted &= table.waiters.keys()
        due = [w for w in table.due_next() if w.waiter_id not in self._hinted]
        if due:
            busy = table.busy_tenants()
            for waiter in due:
                self._hinted.add(waiter.waiter_id)
                self._start(waiter, busy)

    def _start(self, waiter: Waiter, busy: set[str]) -> None:
        try:
            coro = self._preparer.prepare_ahead(waiter.tenant_id, waiter.gpus, busy)
            done, _, rest = eager.start(coro)
        except Exception as exc:
            log.warning("preparing %s ahead of its turn failed: %s", waiter.tenant_id, exc)
            return
        if not done and rest is not None:
            self._spawn(_finish(waiter.tenant_id, rest))


async def _finish(tenant_id: str, rest: eager.Rest[None]) -> None:
    try:
        await rest
    except Exception as exc:
        log.warning("preparing %s ahead of its turn failed: %s", tenant_id, exc)
