"""Turns an acquire takes instead of queueing (`agent.server.turns`): a grant an agent restart
lost the answer to, and the turn given back to a tenant after a revocation
(`agent.server.resumes`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from agent.core.errors import TurnRevoked, UnknownLease
from agent.core.leases import Lease, Waiter
from agent.server.turn_state import Granted, TurnState
from agent.server.waits import standing

log = logging.getLogger(__name__)


def owed_turn(
    state: TurnState, tenant_id: str, wanted: Sequence[str], revoked: str
) -> Lease | Waiter | None:
    """The turn on `wanted` owed to the tenant that its acquire takes, granted (a lease) or
    still queued (its resume, to `join`); None: the acquire queues."""
    lost = _lost_grant(state, tenant_id, wanted)
    if lost is not None:
        return lost
    alone = not state.sessions.names_revoked(tenant_id)  # (no session, or llm-d's caller)
    return state.resumes.owed(tenant_id, wanted, revoked, state.table, alone)


async def join(
    state: TurnState,
    resume: Waiter,
    timeout: float | None,
    on_grant: Callable[[Lease], None] | None,
) -> Granted:
    """Wait (up to `timeout` seconds) for the queued `resume` to be granted, as the acquire's
    turn (`Resumes.join`)."""

    def why() -> str:
        return str(standing(state.table, state.metrics, resume, state.clock())["why"])

    lease = await state.resumes.join(resume, timeout, on_grant, why, state.sessions)
    return Granted(lease, lease.granted_at - resume.enqueued_at)


def renewed(state: TurnState, tenant_id: str, lease_id: str, gone: UnknownLease) -> Lease:
    """A renewal of `lease_id`, which the agent does not hold (`gone`): a revoked lease, whose
    client may never have heard so, is answered with the turn that gave it back, or
    `TurnRevoked` while that turn waits (the client resumes it); else `gone` is raised."""
    found = state.resumes.following(tenant_id, lease_id, state.table)
    if isinstance(found, Lease):
        log.info("tenant %s renewed its revoked lease %s: given back as %s", tenant_id, lease_id,
                 found.lease_id)  # fmt: skip
        return found
    if found is None:
        raise gone
    why = standing(state.table, state.metrics, found, state.clock())["why"]
    raise TurnRevoked(
        f"lease {lease_id} was revoked (held past the maximum hold time, or a higher tier "
        "waited) while this client could not hear it (its session was down, or the agent "
        f"restarted); its turn is given back to {tenant_id} as the GPUs free: {why}"
    )


def _lost_grant(state: TurnState, tenant_id: str, wanted: Sequence[str]) -> Lease | None:
    """The turn on `wanted` the agent before a restart granted the tenant, if its client never
    named it since: the grant's answer was lost with that agent (the client asks again), so
    this acquire is answered with it, same lease and fencing tokens."""
    unclaimed = state.unclaimed  # empty but for the first turns after a restart
    for lease_id in list(unclaimed):
        lease = state.table.leases.get(lease_id)
        if lease is None:  # ended meanwhile
            unclaimed.discard(lease_id)
        elif lease.tenant_id == tenant_id and set(lease.gpus) == set(wanted):
            unclaimed.discard(lease_id)
            log.info(
                "tenant %s asked for the turn on [%s] granted before the agent restarted "
                "(its answer was lost): lease %s is handed back",
                tenant_id, ", ".join(lease.gpus), lease.lease_id,
            )  # fmt: skip
            return lease
    return None
