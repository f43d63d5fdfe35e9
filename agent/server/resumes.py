"""Which turn gives a revoked lease's tenant the GPU back (`agent.server.turns`).

A lease revoked at the maximum hold (or for a higher tier) queues its tenant first for the turn
after: that waiter, granted, is a new lease. A yield that names the revoked lease ends the one
that followed it; a job's turn (`agent.server.jobturns`) hears of
each revocation so that its record names the member's lease that follows.
"""

from __future__ import annotations

from collections.abc import Callable

from agent.core.leases import Lease, LeaseTable

Follow = Callable[[str, str, str], None]
"""Hears (tenant id, revoked lease id, id of the waiter that resumes it, then its lease)."""


class Resumes:
    """Revoked lease id → the waiter (then lease) that gives its tenant the turn back."""

    def __init__(self) -> None:
        self._next: dict[str, str] = {}
        self.follow: Follow | None = None
        """Who hears of each resume as its revocation queues it (the node's job turns)."""

    def revoked(self, lease: Lease, resume_id: str, table: LeaseTable) -> None:
        """`lease` was revoked and `resume_id` queued to give it back."""
        live = table.waiters.keys() | table.leases.keys()
        self._next = {k: v for k, v in self._next.items() if v in live}
        self._next[lease.lease_id] = resume_id
        if self.follow is not None:
            self.follow(lease.tenant_id, lease.lease_id, resume_id)

    def take(self, lease_id: str) -> str:
        """The turn that followed the revoked `lease_id` ("" if none), forgotten here."""
        return self._next.pop(lease_id, "")
