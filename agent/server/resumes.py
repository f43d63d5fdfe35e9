"""Which turn gives a revoked lease's tenant the GPU back (`agent.server.turns`).

A lease revoked at the maximum hold (or for a higher tier) queues its tenant first for the turn
after: that waiter, granted, is a new lease. A yield that names the revoked lease ends the one
that followed it, however many revocations ago; a job's turn (`agent.server.jobturns`) hears of
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
        """`lease` was revoked and `resume_id` queued to give it back. A resumed lease revoked
        again passes its resume on: each id that led to it leads to the new one."""
        live = table.waiters.keys() | table.leases.keys()
        revoked = lease.lease_id
        self._next = {
            k: resume_id if v == revoked else v
            for k, v in self._next.items()
            if v in live or v == revoked
        }
        self._next[revoked] = resume_id
        if self.follow is not None:
            self.follow(lease.tenant_id, revoked, resume_id)

    def take(self, lease_id: str) -> str:
        """The turn that followed the revoked `lease_id` ("" if none), forgotten here."""
        return self._next.pop(lease_id, "")
