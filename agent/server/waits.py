"""Why a waiter waits: its place in its GPUs' queues, its tier, its share used against its
entitlement, and a refusal's reason with its numbers (told to the waiter too); plus the lease's
wire form."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent.core.errors import AcquireTimeout, NeverGranted, WaitRefused
from agent.core.leases import Lease, LeaseTable, Waiter
from agent.core.residency import TooLarge
from agent.core.waiters import TenantUsage
from agent.server.metrics import AgentMetrics
from agent.server.sessions import SessionRegistry
from baton._pb import agent_pb2 as pb
from baton.contract.names import ANOTHER_NAMESPACES_JOB

log = logging.getLogger(__name__)


HIDDEN = ANOTHER_NAMESPACES_JOB
"""How a tenant the caller may not see is named to it (llm-d's `Jobs.seen_by`)."""


def standing(
    table: LeaseTable,
    metrics: AgentMetrics,
    waiter: Waiter,
    now: float,
    seen: Callable[[str], bool] = lambda tenant_id: True,
) -> dict[str, Any]:
    """Where `waiter` stands on each of its GPUs, and one sentence saying why it waits, naming
    the tenants `seen` accepts (the others as `HIDDEN`)."""

    def name(tenant_id: str) -> str:
        return tenant_id if seen(tenant_id) else HIDDEN

    usage = table.usage.get(waiter.tenant_id, TenantUsage())
    where: list[str] = []
    position = 0
    used = 0.0
    for gpu in waiter.gpus:
        queue = table.queue_of(gpu)
        ahead = [name(w.tenant_id) for w in queue[: _index(queue, waiter)]]
        position = max(position, len(ahead) + 1)
        used = max(used, metrics.share_last_minute(gpu, waiter.tenant_id, now))
        holder = table.leases.get(table.gpu(gpu).holder or "")
        kept = table.anticipation.held_for(gpu, now)
        first = [f"holder {name(holder.tenant_id)}"] if holder else []
        first += (
            [f"{name(kept)} (owed, kept for it as it asks again)"] if kept and not holder else []
        )
        behind = first + ahead
        where.append(f"{gpu} behind {', '.join(behind)}" if behind else f"{gpu} free")
    why = waiter.blocked or (
        f"position {position} ({'; '.join(where)}); tier {usage.tier}, "
        f"share used {used:.0%} of entitled {usage.duty / 100:.0%}"
    )
    return {
        "position": position,
        "tier": usage.tier,
        "share_used": round(used, 4),
        "share_entitled": usage.duty / 100,
        "why": why,
    }


def standings(
    table: LeaseTable, metrics: AgentMetrics, now: float, due: float | None = None
) -> Mapping[str, str]:
    """Why each waiter waits (only those whose deadline is at or before `due`, if given)."""
    return {
        w.waiter_id: standing(table, metrics, w, now)["why"]
        for w in list(table.waiters.values())
        if due is None or (w.deadline is not None and w.deadline <= due)
    }


def tell_blocked(sessions: SessionRegistry, waiter: Waiter, reason: str) -> None:
    """A waiter a refusal keeps waiting hears why (`pb.Waiting`, once per reason), as the
    agent's log says it: an acquire with no timeout would hear nothing else."""
    if reason == waiter.told:
        return
    waiter.told = reason
    log.warning("turn for %s waits: %s", waiter.tenant_id, reason)
    waiting = pb.Waiting(gpus=waiter.gpus, reason=reason)
    sessions.notify(waiter.tenant_id, pb.AgentMessage(waiting=waiting))


def timed_out(waiter: Waiter, reason: str) -> AcquireTimeout:
    """The error a waiter past its deadline gets: `WaitRefused` when a refusal kept it."""
    return (WaitRefused if waiter.blocked else AcquireTimeout)(
        f"no turn on [{', '.join(waiter.gpus)}] within the timeout; "
        f"the request has left the queue; it waited because {reason}"
    )


def never_granted(gpus: Sequence[str], error: Exception) -> Exception:
    """The error an ask for `gpus` whose turn can never be prepared gets at once."""
    if isinstance(error, TooLarge):
        return NeverGranted(f"no turn on [{', '.join(gpus)}] can ever be granted: {error}")
    return error


def _index(queue: list[Waiter], waiter: Waiter) -> int:
    for i, w in enumerate(queue):
        if w.waiter_id == waiter.waiter_id:
            return i
    return len(queue)


def lease_to_pb(lease: Lease, contended: bool = False) -> pb.Lease:
    message = pb.Lease(
        lease_id=lease.lease_id,
        tenant_id=lease.tenant_id,
        gpus=lease.gpus,
        granted_at=lease.granted_at,
        hold_until=lease.hold_until,
        contended=contended,
    )
    tokens = message.fencing_tokens  # set one by one: a dict given to the constructor goes
    for gpu, token in lease.tokens.items():  # through the Python-level MutableMapping.update
        tokens[gpu] = token
    return message
