"""A job's turn as the arbiter (`coordinator.turns`) holds it or is asked for it, the errors its
callers get, and why a job waits."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.core.waiters import Waiter
from baton.contract.names import ANOTHER_NAMESPACES_JOB
from coordinator.cluster import Plan

log = logging.getLogger(__name__)


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
    joins: dict[str, str] = field(default_factory=dict)
    """A joined pod → the id of its latest join (none for a pod a new leader found joined):
    a Leave naming an earlier join is one the pod sent before it joined again."""
    pods: frozenset[str] = frozenset()
    """The member pods (namespace/name) the turn was prepared for on its nodes."""
    ended: asyncio.Event = field(default_factory=asyncio.Event, repr=False, compare=False)
    """Set once the turn is over (yielded, or this replica stepped down)."""


@dataclass
class Asked:
    """A job's turn being asked for: its plan, and what its callers wait on."""

    plan: Plan
    abandoned: bool = False
    moving: bool = False
    callers: list[asyncio.Future[JobTurn]] = field(default_factory=list)
    """One future per call waiting on it (the job's members and retries ask for one turn
    together): each caller's own, so one that gives up cancels only its own, and a caller
    wakes in the step its turn is decided (no task or shield between)."""

    def ask(self) -> asyncio.Future[JobTurn]:
        """A future for one more caller."""
        future = asyncio.get_running_loop().create_future()
        self.callers.append(future)
        return future

    def leave(self, future: asyncio.Future[JobTurn]) -> bool:
        """A caller gives up; whether another still waits."""
        if future in self.callers:
            self.callers.remove(future)
        return bool(self.callers)

    def grant(self, turn: JobTurn) -> None:
        """Every caller still waiting has the turn."""
        for future in self.callers:
            if not future.done():
                future.set_result(turn)

    def fail(self, error: Exception) -> None:
        """Every caller still waiting hears why there is no turn."""
        for future in self.callers:
            if not future.done():
                future.set_exception(error)


OTHER = ANOTHER_NAMESPACES_JOB
"""How a caller is told of a job of a namespace not its own (its name is that namespace's)."""


def sees(viewer: str | None, namespace: str) -> bool:
    """Whether a caller of namespace `viewer` may see `namespace`'s jobs by name (None: a caller
    who may see every job; "": one who may see none)."""
    return viewer is None or namespace == viewer


def seen_as(key: str, viewer: str | None) -> str:
    """A job's key (`namespace/job[@group]`) as a caller of namespace `viewer` may read it: its
    own namespace's by name, another's as `OTHER` (`sees`)."""
    return key if sees(viewer, key.partition("/")[0]) else OTHER


def _jobs(keys: Iterable[str], viewer: str | None) -> str:
    """Jobs (keys) as a caller of namespace `viewer` may read them: "job a/x, a/y", and the
    others counted."""
    keys = set(keys)
    named = sorted(k for k in keys if seen_as(k, viewer) == k)
    hidden = len(keys) - len(named)
    parts = [f"job {', '.join(named)}"] if named else []
    if hidden:
        parts.append(OTHER if hidden == 1 else f"{hidden} jobs of other namespaces")
    return " and ".join(parts)


def late(
    plan: Plan,
    held: Iterable[JobTurn],
    waiters: Iterable[Waiter],
    moving: bool,
    viewer: str | None,
) -> TimeoutError:
    """The error of the plan's ask whose deadline came, for a caller of namespace `viewer`
    (None: one who sees every job); the log names every job."""
    told = why_late(plan.key, plan.resources, held, waiters, moving, viewer)
    if told != (full := why_late(plan.key, plan.resources, held, waiters, moving)):
        log.info("%s", full)
    return TimeoutError(told)


def not_holder(key: str, holder: str, viewer: str | None) -> NotHolder:
    """The error of a yield of job turn `key` it does not hold (`holder` does: "" for none),
    for a caller of namespace `viewer` (None: one who sees every job)."""
    namespace_job, _, group = key.partition("@")
    on = f" on group {group!r}" if group else ""
    held_by = seen_as(holder, viewer) if holder else "nobody"
    return NotHolder(f"job {namespace_job} does not hold the turn{on} (held by {held_by})")


def why_late(
    key: str,
    resources: Iterable[str],
    held: Iterable[JobTurn],
    waiters: Iterable[Waiter],
    moving: bool,
    viewer: str | None = None,
) -> str:
    """Why the job `key` had no turn on `resources` by its deadline, in one sentence, naming
    only the jobs a caller of namespace `viewer` may see (None: every one)."""
    if moving:
        return f"job {key}: its turn was still being prepared on its nodes at the deadline"
    wanted = set(resources)
    holders = {t.key for t in held if wanted & set(t.resources)}
    others = [w for w in waiters if w.tenant_id != key and wanted & set(w.gpus)]
    parts = [f"held by {_jobs(holders, viewer)}"] if holders else []
    if preparing := {w.tenant_id for w in others if w.reserved}:
        parts.append(f"being prepared for {_jobs(preparing, viewer)}")
    elif queued := {w.tenant_id for w in others}:
        parts.append(f"asked for by {_jobs(queued, viewer)} too")
    why = f"; its GPUs were {' and '.join(parts)}" if parts else ""
    return f"job {key}: no turn before the deadline{why}"


def time_left(deadline: float | None, now: float) -> float | None:
    """Seconds from `now` to `deadline` (none: None), at least 0."""
    return None if deadline is None else max(0.0, deadline - now)


def parse_turn_key(key: str) -> tuple[str, str, str]:
    """(namespace, job, group) of an arbiter key (`cluster.turn_key`; group "" where none)."""
    namespace, _, rest = key.partition("/")
    job, _, group = rest.partition("@")
    return namespace, job, group
