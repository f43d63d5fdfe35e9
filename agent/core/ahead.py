"""Restore-ahead: tell the residency layer who is due next on each held GPU.

While a holder runs, the preparer can park an idle tenant and restore the one due next, so that
the grant after the holder's yield moves nothing. Due next is the first waiter in line; when
nobody waits yet, it is the tenant expected next if the GPU's turns repeat (RL loops take turns
in a cycle): the one whose turn followed the holder's previous turn. Hints never wait and never
fail a grant; a wrong guess costs moves, never a turn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass
from typing import Any

from agent.core import eager
from agent.core.leases import GpuState, LeaseTable, Waiter
from agent.core.residency import TurnPreparer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Due:
    """A tenant to ready ahead of its turn on `gpus`."""

    tenant_id: str
    gpus: tuple[str, ...]
    key: str
    """Names this hint: each is given once."""
    anchor: str
    """The waiter or the holder's lease the hint stands on; it lapses when that is gone."""


def busy_tenants(table: LeaseTable) -> set[str]:
    """Tenants holding a turn, or reserved one that is being prepared: never parked ahead."""
    busy = {lease.tenant_id for lease in table.leases.values()}
    return busy | {w.tenant_id for w in table.waiters.values() if w.reserved}


def expected_after(state: GpuState, holder: str, exclude: Collection[str]) -> str | None:
    """If the GPU's turns repeat, the tenant whose turn followed the holder's previous one."""
    previous = state.served.get(holder)
    if previous is None:
        return None
    later = [(end, t) for t, end in state.served.items() if end > previous and t not in exclude]
    return min(later)[1] if later else None


def due_next(table: LeaseTable) -> list[Due]:
    """Per held GPU: its first eligible waiter, or if nobody waits, the tenant expected next."""
    held = {g: table.leases[s.holder] for g, s in table.gpus.items() if s.holder in table.leases}
    if not held:
        return []
    heads: dict[str, Waiter] = {}
    for waiter in table.queue():
        for gpu in set(waiter.gpus) & held.keys():
            heads.setdefault(gpu, waiter)
    exclude = busy_tenants(table) | {w.tenant_id for w in table.waiters.values()}
    due: dict[str, Due] = {}
    for gpu, lease in sorted(held.items()):
        head = heads.get(gpu)
        if head is not None:
            if not (head.blocked or head.reserved):
                due[head.waiter_id] = Due(head.tenant_id, head.gpus, head.waiter_id, head.waiter_id)
            continue
        expected = expected_after(table.gpus[gpu], lease.tenant_id, exclude)
        if expected is not None:
            key = f"{lease.lease_id}/{expected}"
            due.setdefault(key, Due(expected, (gpu,), key, lease.lease_id))
    return list(due.values())


class LookAhead:
    """Names each held GPU's next tenant to the preparer, once per hint."""

    def __init__(
        self, preparer: TurnPreparer, spawn: Callable[[Coroutine[Any, Any, None]], object]
    ) -> None:
        self._preparer = preparer
        self._spawn = spawn
        self._hinted: dict[str, str] = {}

    def look(self, table: LeaseTable) -> None:
        """Hint the tenants now due next that were not hinted before."""
        live = table.waiters.keys() | table.leases.keys()
        self._hinted = {k: a for k, a in self._hinted.items() if a in live}
        due = [d for d in due_next(table) if d.key not in self._hinted]
        if due:
            busy = busy_tenants(table)
            for d in due:
                self._hinted[d.key] = d.anchor
                self._start(d, busy)

    def _start(self, due: Due, busy: set[str]) -> None:
        try:
            coro = self._preparer.prepare_ahead(due.tenant_id, due.gpus, busy)
            done, _, rest = eager.start(coro)
        except Exception as exc:
            log.warning("preparing %s ahead of its turn failed: %s", due.tenant_id, exc)
            return
        if not done and rest is not None:
            self._spawn(_finish(due.tenant_id, rest))


async def _finish(tenant_id: str, rest: eager.Rest[None]) -> None:
    try:
        await rest
    except Exception as exc:
        log.warning("preparing %s ahead of its turn failed: %s", tenant_id, exc)
