"""llm-d Acquire calls of one job's turn that wait together.

llm-d's client may ask again while its first Acquire still waits (a retry after its own timeout,
a second thread): every call waits for the same turn, each until its own deadline, and the job
keeps its place in the queue while any of them waits. The coordinator does the same
(`coordinator.turns`). A job whose turn the node revoked keeps its place first in the queue
for the turn given back whatever becomes of its calls (`agent.server.resumes`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.core.errors import AcquireTimeout, WaitRefused
from agent.node.tenants import Tenant
from agent.server.resumes import late
from agent.server.service import LeaseService
from agent.server.turn_state import Granted
from agent.server.waits import standing, timed_out

log = logging.getLogger(__name__)


@dataclass
class _Asked:
    task: asyncio.Task[Granted]
    calls: int = 0


class Asking:
    """The turns llm-d's Acquire calls wait for, one wait per job and GPUs."""

    def __init__(self, service: LeaseService) -> None:
        self._service = service
        self._asked: dict[tuple[str, frozenset[str]], _Asked] = {}

    async def acquire(
        self,
        tenant: Tenant,
        gpus: Sequence[str],
        timeout: float | None,
        job: str,
        seen: Callable[[str], bool] = lambda tenant_id: True,
    ) -> Granted:
        """Wait for the tenant's turn on `gpus` beside the calls already waiting for it (the
        grant answers them all); the place in the queue is given up when the last one goes.
        A call past its deadline hears why, naming the tenants `seen` lets its caller see."""
        key = (tenant.tenant_id, frozenset(gpus))
        asked = self._asked.get(key)
        if asked is None or asked.task.done():
            task = asyncio.ensure_future(self._service.acquire(tenant, gpus, None))
            asked = self._asked[key] = _Asked(task)
        else:
            log.info(
                "job %s asks for its turn on [%s] again while %d earlier Acquire waits: they "
                "wait for the same turn", job, ", ".join(sorted(gpus)), asked.calls,
            )  # fmt: skip
        asked.calls += 1
        try:
            return await asyncio.wait_for(asyncio.shield(asked.task), timeout)
        except TimeoutError:
            if asked.task.done():  # granted (or refused) just as the deadline came
                return asked.task.result()
            raise self._late(tenant.tenant_id, key[1], asked.calls - 1, seen) from None
        finally:
            asked.calls -= 1
            if not asked.calls:
                if self._asked.get(key) is asked:
                    del self._asked[key]
                asked.task.cancel()  # leaves the queue (a turn granted meanwhile ends)

    def _late(
        self, tenant_id: str, gpus: frozenset[str], others: int, seen: Callable[[str], bool]
    ) -> AcquireTimeout:
        """Why a call's deadline came first (its place in the queue); the last call's takes the
        job out of the queue, as a waiter past its deadline leaves it."""
        table = self._service.table
        wanted = ", ".join(sorted(gpus))
        waiter = next(
            (w for w in table.waiters.values() if w.tenant_id == tenant_id and set(w.gpus) == gpus),
            None,
        )
        if waiter is None:
            return AcquireTimeout(f"no turn on [{wanted}] within the timeout")
        if waiter.reserved:
            why = full = "its turn was being prepared (its memory being made resident)"
        else:
            now, metrics = self._service.state.clock(), self._service.metrics
            why = standing(table, metrics, waiter, now, seen)["why"]
            full = standing(table, metrics, waiter, now)["why"]  # for the log and events
        if waiter.front:  # its revoked turn, given back as the GPUs free: it stays queued
            return late(waiter, why)
        if others:
            return (WaitRefused if waiter.blocked else AcquireTimeout)(
                f"no turn on [{wanted}] within the timeout; {others} other Acquire of the job "
                f"still waits for it, keeping its place in the queue; it waited because {why}"
            )
        error = timed_out(waiter, why)
        if not waiter.reserved:  # one being prepared is given up on as its caller goes
            self._service.expire(waiter.waiter_id, error, full)
        return error
