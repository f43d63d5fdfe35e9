"""Revocations in flight and ones to try again: a holder past its maximum hold that could not be
parked keeps its GPU, and parking it is tried again `retry_s` later. So are the waiters whose
grant's moves failed (`moves_failed`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from agent.core.leases import Lease, LeaseTable
from agent.core.residency import MoveFailed

log = logging.getLogger(__name__)

REVOKE_RETRY_S = 5.0
"""Seconds before parking a holder past its maximum is tried again, after it failed."""


class Revocations:
    """Which leases are being revoked now, and when failed ones may be tried again."""

    def __init__(self, retry_s: float = REVOKE_RETRY_S) -> None:
        self.retry_s = retry_s
        self.running: set[str] = set()
        self.retry_at: dict[str, float] = {}
        self.moves_retry_at: float | None = None
        """When the waiters blocked by a failed move are tried again."""

    def may_start(self, lease_id: str, now: float) -> bool:
        """Not being revoked now, and not waiting to be tried again after a failed park."""
        return lease_id not in self.running and self.retry_at.get(lease_id, now) <= now

    def start(self, lease_id: str) -> None:
        """Parking the holder of `lease_id` starts."""
        self.running.add(lease_id)
        self.retry_at.pop(lease_id, None)

    def finished(self, lease_id: str) -> None:
        """Parking the holder of `lease_id` is over (done or failed)."""
        self.running.discard(lease_id)

    def failed(self, table: LeaseTable, lease: Lease, error: Exception, now: float) -> str:
        """Parking the holder failed: it keeps its turn, its waiters show why (returned), and
        it is tried again `retry_s` from `now`."""
        why = (
            f"{lease.tenant_id} holds [{', '.join(lease.gpus)}] past its maximum but could not "
            f"be parked ({error}); it keeps the GPU, tried again in {self.retry_s:g} s"
        )
        log.warning("%s", why)
        self.retry_at[lease.lease_id] = now + self.retry_s
        for gpu in lease.gpus:
            for waiter in table.queue_of(gpu):
                if not waiter.reserved:
                    waiter.blocked = why
        return why

    def moves_failed(self, error: Exception | None, now: float) -> None:
        """If `error` is a grant's failed move (`MoveFailed`, which nothing else that changes
        may cure), the blocked waiters are tried again `retry_s` from `now`."""
        if isinstance(error, MoveFailed) and self.moves_retry_at is None:
            self.moves_retry_at = now + self.retry_s

    def moves_due(self, now: float, table: LeaseTable) -> bool:
        """Whether the blocked waiters are tried again now (once per `moves_failed`): if so,
        they are unblocked in `table`, to be dispatched."""
        due = self.moves_retry_at is not None and self.moves_retry_at <= now
        if due:
            self.moves_retry_at = None
            table.unblock_all()
        return due

    def sooner(
        self,
        deadline: float | None,
        now: float,
        live: Collection[str],
        wanted: Callable[[str], bool],
    ) -> float | None:
        """`deadline`, or sooner if a failed revocation of a `live` lease still `wanted` (someone
        waits for its GPUs), or the retry of a failed move, is due before it. A lease nobody
        waits for any more keeps its retry time untimed: the next waiter's revocation waits
        for it (were it timed, it would be due at once, again and again, until the lease ends)."""
        self.retry_at = {k: t for k, t in self.retry_at.items() if k in live}
        retries = [t for k, t in self.retry_at.items() if wanted(k)]
        if self.moves_retry_at is not None:
            retries.append(self.moves_retry_at)
        retry = min(retries, default=None)
        if retry is not None and (deadline is None or retry < deadline):
            return max(retry, now)
        return deadline
