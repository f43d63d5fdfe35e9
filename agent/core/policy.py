"""Queue policies: the order in which waiters are served.

A policy sorts the waiters; it sees each tenant's usage (when it was last served, how long it
has held GPUs, its expected `gpu-duty`). Waiters marked `front` (a revoked holder resuming)
always come first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from agent.core.waiters import TenantUsage, Waiter

Policy = Callable[[list[Waiter], Mapping[str, TenantUsage]], list[Waiter]]


def fifo(waiters: list[Waiter], usage: Mapping[str, TenantUsage]) -> list[Waiter]:
    """First come, first served."""
    return sorted(waiters, key=lambda w: (not w.front, w.seq))


def least_recently_served(waiters: list[Waiter], usage: Mapping[str, TenantUsage]) -> list[Waiter]:
    """The tenant whose last turn ended longest ago goes first; never-served tenants before all.

    Ties (e.g. two newcomers) go to the tenant with the least GPU time per unit of `gpu-duty`.
    """

    def key(w: Waiter) -> tuple[bool, float, float, int]:
        u = usage.get(w.tenant_id)
        last = float("-inf") if u is None or u.last_served is None else u.last_served
        share = 0.0 if u is None else u.served_seconds / max(1, u.duty)
        return (not w.front, last, share, w.seq)

    return sorted(waiters, key=key)


POLICIES: dict[str, Policy] = {"fifo": fifo, "lrs": least_recently_served}
QUEUE_POLICIES = (*POLICIES, "fair")
"""Every `--queue-policy`: the stateless ones, and `fair` (`agent.core.fair`, one per table)."""
DEFAULT_QUEUE_POLICY = "fair"
"""The agent's `--queue-policy` when none is set (docs/fairness.md says why)."""
