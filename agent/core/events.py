"""The agent's event stream: grants, yields, revocations and departures, as they happen."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

WATCHING = "watching"
"""The first event of every WatchEvents stream: the subscription is live."""
QUEUED = "queued"
GRANTED = "granted"
YIELDED = "yielded"
REVOKED = "revoked"
EXPIRED = "expired"
CANCELLED = "cancelled"
TENANT_JOINED = "tenant_joined"
CONNECTED = "connected"
DISCONNECTED = "disconnected"
TENANT_GONE = "tenant_gone"
QUARANTINED = "quarantined"
"""The tenant's memory cannot be moved safely any more: it takes no more turns (detail: why)."""
REVOKE_FAILED = "revoke_failed"
"""A holder past its maximum could not be parked: it keeps the GPU (detail: why)."""
STOPPING = "agent_stopping"
"""The last event of every WatchEvents stream when the agent stops (detail: why)."""


@dataclass(frozen=True)
class Event:
    """One thing that happened on the node."""

    kind: str
    tenant_id: str
    at: float
    gpus: tuple[str, ...] = ()
    lease_id: str = ""
    tokens: Mapping[str, int] = field(default_factory=dict)
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form."""
        return {
            "kind": self.kind,
            "tenant_id": self.tenant_id,
            "at": self.at,
            "gpus": list(self.gpus),
            "lease_id": self.lease_id,
            "fencing_tokens": dict(self.tokens),
            "detail": self.detail,
        }


class EventBus:
    """Fans events out to subscribers; a subscriber that falls behind loses its oldest events
    (`lost` counts them)."""

    def __init__(self, backlog: int = 1024) -> None:
        self.backlog = backlog
        self._queues: dict[asyncio.Queue[Event], int] = {}

    def publish(self, event: Event) -> None:
        """Deliver `event` to every subscriber without waiting."""
        for queue in self._queues:
            if queue.full():
                queue.get_nowait()
                self._queues[queue] += 1
            queue.put_nowait(event)

    def lost(self, queue: asyncio.Queue[Event]) -> int:
        """How many events `queue` lost for falling more than the backlog behind."""
        return self._queues.get(queue, 0)

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[Event]]:
        """`async with bus.subscribe() as events: event = await events.get()`."""
        queue = self.attach()
        try:
            yield queue
        finally:
            self.detach(queue)

    def attach(self) -> asyncio.Queue[Event]:
        """A queue that gets every event from now on, until `detach`."""
        queue: asyncio.Queue[Event] = asyncio.Queue(self.backlog)
        self._queues[queue] = 0
        return queue

    def detach(self, queue: asyncio.Queue[Event]) -> None:
        self._queues.pop(queue, None)
