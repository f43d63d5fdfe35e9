"""How long a waiter may wait for its turn under the `fifo` and `lrs` policies. Pure.

The wait runs from the waiter's `queued` event to its `granted` event. Meanwhile each other
tenant sharing one of its GPUs is served at most once ahead of it (fifo serves those queued
before it, lrs those last served before it; either puts a tenant just served behind it), and a
holder revoked for holding past the maximum takes one more turn ahead (its turn handed back).
Each such turn holds the GPU at most `max_hold` seconds (a revocation parks it then); each
handover, from one turn's end to the next grant on that GPU (the incoming tenant's restore, the
parks that make its room, behind the node's other preparations: one plan runs at a time per
node), takes at most `handover` seconds, a stated slack the agent does not enforce. Hence

    wait <= turns_ahead * (max_hold + handover) + handover
"""

from __future__ import annotations

from dataclasses import dataclass

HANDOVER_S = 1.0
"""The slack each handover is allowed: one turn's end (or its revocation) to the next grant."""


@dataclass(frozen=True)
class WaitBound:
    """The longest wait a queue position allows, with the hold and handover it assumes."""

    max_hold: float
    handover: float = HANDOVER_S

    @staticmethod
    def turns_ahead(sharing: int, resumed: int = 0) -> int:
        """Turns served ahead of a waiter at most: once for each of the `sharing` other
        tenants on its GPUs, plus `resumed` revoked holders handed their turn back."""
        return sharing + resumed

    def longest_wait(self, turns_ahead: int) -> float:
        """Seconds from `queued` to `granted` for a waiter with `turns_ahead` turns before it."""
        return turns_ahead * (self.max_hold + self.handover) + self.handover

    def turn_ends_by(self, granted_at: float, contended_at: float) -> float:
        """When a turn others wait for ends at the latest: its maximum hold runs out (or, if
        it ran out before anyone waited, the first waiter comes), then the revocation's park
        takes at most a handover."""
        return max(granted_at + self.max_hold, contended_at) + self.handover
