"""What waits for a turn, and what a queue policy may know about each tenant."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass


@dataclass
class Waiter:
    """A tenant waiting for a turn."""

    waiter_id: str
    tenant_id: str
    gpus: tuple[str, ...]
    seq: int
    enqueued_at: float
    deadline: float | None = None
    front: bool = False
    """Queued ahead of everyone (a revoked holder waiting to resume)."""
    reserved: bool = False
    blocked: str = ""
    """Why the last attempt to make room failed; empty when eligible."""
    told: str = ""
    """The last such reason its tenant's sessions were told (`pb.Waiting`)."""
    handed: bool = False
    """Its client restores what it parked as the grant reaches it (`restores_with_grant`), so
    its own restores may be left to it."""


@dataclass
class TenantUsage:
    """What a policy may know about a tenant."""

    last_served: float | None = None
    served_seconds: float = 0.0
    duty: int = 100
    tier: int = 0
    """Its priority tier (the pod's priority); only the `fair` policy reads it."""


def waiting_on(waiters: Collection[Waiter], gpus: tuple[str, ...]) -> dict[str, set[str]]:
    """Each of `gpus` → the tenants among `waiters` that wait for it."""
    return {g: {w.tenant_id for w in waiters if g in w.gpus} for g in gpus}
