"""Kept turns: an owed holder's client starts its next turn without asking the agent.

Under the fair policy a tenant written as a loop (`while True: with baton.turn(): step()`) is
often owed the GPU over whoever waits, and the agent then keeps the GPU for it across its yield
(`agent.core.anticipation`). That still costs the GPU a round trip per turn: the yield travels
to the agent, the answer back, then the next acquire and its grant; on a 2-vCPU machine the
agent, idle through the turn, takes most of a millisecond to wake for it. So while the holder
runs the agent tells its client for how long the policy would keep granting it straight back
(`KeepTurn`: seconds from the lease's grant, `Keeping.keep_for`), and again whenever that
changes (a waiter comes or goes). Within that, the client's yield keeps the lease and its next
acquire, if it comes within the anticipation window, takes it back at once; otherwise it yields
the lease to the agent as any turn. The agent sees one long lease and counts it all as the
tenant's GPU time, its gaps included (as anticipation charges the holds it makes).
"""

from __future__ import annotations

from agent.core.leases import LeaseTable
from agent.server.sessions import SessionRegistry
from baton._pb import agent_pb2 as pb

CHANGE_S = 1e-4
"""A change in what a holder may keep below this is not worth a message."""


class KeptTurns:
    """What each holder's client was last told it may keep (lease id → seconds from grant)."""

    def __init__(self, sessions: SessionRegistry) -> None:
        self._sessions = sessions
        self._told: dict[str, float] = {}

    def look(self, table: LeaseTable) -> None:
        """Tell each holder whose client keeps turns what changed (after a step that changed
        the turns)."""
        if table.fair is None or table.anticipation.window_s <= 0:
            return
        self._told = {k: v for k, v in self._told.items() if k in table.leases}
        for lease in table.leases.values():
            keeps = self._sessions.keeps_turns(lease.tenant_id)  # (a session opened since: 0)
            until = table.keeping.keep_for(lease) if keeps else 0.0
            told = self._told.get(lease.lease_id, 0.0)
            if abs(until - told) < CHANGE_S and (until > 0) == (told > 0):
                continue
            self._told[lease.lease_id] = until
            keep = pb.KeepTurn(
                lease_id=lease.lease_id, until_s=until, window_s=table.anticipation.window_s
            )
            self._sessions.notify(lease.tenant_id, pb.AgentMessage(keep_turn=keep))
