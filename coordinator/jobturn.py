"""A job's turn as the arbiter (`coordinator.turns`) holds it, and the errors its callers get."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


class NotLeading(Exception):
    """This replica does not lead (UNAVAILABLE): the caller asks the Service again."""


class NotHolder(Exception):
    """The job does not hold that turn (PERMISSION_DENIED)."""


class TurnFailed(Exception):
    """The job's turn could not be prepared on every node; the message names the node and why."""


@dataclass
class JobTurn:
    """A job's turn, held across its nodes."""

    key: str
    turn_id: str
    """The same on every node of the turn (the agents' name for it)."""
    lease_id: str
    """The coordinator's lease on the turn's GPUs (its table's name for it)."""
    namespace: str
    job: str
    group: str
    nodes: dict[str, str]
    """node → its agent's address"""
    granted_at: float
    waited: float = 0.0
    restored: bool = False
    resources: tuple[str, ...] = ()
    joined: set[str] = field(default_factory=set)
    """Member pods that joined the turn themselves (`join`) and have not left."""
    pods: frozenset[str] = frozenset()
    """The member pods (namespace/name) the turn was prepared for on its nodes."""
    ended: asyncio.Event = field(default_factory=asyncio.Event, repr=False, compare=False)
    """Set once the turn is over (yielded, or this replica stepped down)."""
