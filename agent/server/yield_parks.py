"""Park-at-yield: a holder that moves its own memory parks it as it yields, when the tenant due
next needs the room.

With the `app` method a park is a callback into the tenant's process. Asked for once the holder
has yielded, it costs a round trip between the agent and that process inside the handover: the
GPU idles while the message travels both ways. But who is due next, and whether its turn will
need the holder parked, is known while the holder still runs. So the agent says so then
(`ParkAtYield` on the holder's session that offers both callbacks: its lease, the GPUs;
not its other processes, which have nothing to park), and again whenever that changes;
the holder's client runs its own park on the thread that yields, before the yield leaves, and
names what it parked in the yield (`YieldRequest.parked`). The next grant then finds the room
made. No hint where the fair policy may keep the GPU for the holder at its yield
(`Keeping.may_keep`), nor past the host budget. A hint that turns out wrong costs a park and
a restore, never a turn; a client that does not act on it is parked by callback, as before.
"""

from __future__ import annotations

from agent.core.leases import LeaseTable, Waiter
from agent.parking.host import Parking
from agent.server.sessions import SessionRegistry
from baton._pb import agent_pb2 as pb


class YieldParks:
    """What each holder was last told to park as it yields (lease id → GPUs)."""

    def __init__(self, parking: Parking | None, sessions: SessionRegistry) -> None:
        self._parking = parking
        self._sessions = sessions
        self._told: dict[str, tuple[str, ...]] = {}

    def look(self, table: LeaseTable) -> None:
        """Tell each holder whose hint changed (after a step that changed the turns)."""
        parking = self._parking
        if parking is None:
            return
        self._told = {k: v for k, v in self._told.items() if k in table.leases}
        parkers = [
            lease for lease in table.leases.values() if self._sessions.parks_alone(lease.tenant_id)
        ]
        if not parkers and not any(self._told.values()):
            return  # nobody to tell (the common case off the `app` method): no queue to sort
        heads: dict[str, Waiter] = {}
        for waiter in table.queue():
            if not waiter.reserved:
                for gpu in waiter.gpus:
                    heads.setdefault(gpu, waiter)
        reserved = 0  # host memory the holders told so far will park
        for lease in list(table.leases.values()):
            holder = lease.tenant_id
            nexts = {heads[g].waiter_id: heads[g] for g in lease.gpus if g in heads}
            found: dict[str, int] = {}
            if nexts and self._sessions.parks_alone(holder):
                for head in nexts.values():
                    if head.tenant_id == holder or table.keeping.may_keep(holder, head):
                        found = {}  # the GPU may stay its own at the yield: park nothing
                        break
                    found |= parking.parks_at_yield(holder, head.tenant_id, head.gpus, reserved)
            gpus = tuple(sorted(set(found) & set(lease.gpus)))
            reserved += sum(found[g] for g in gpus)
            parking.told_to_park(holder, lease.gpus, {g: found[g] for g in gpus})
            if gpus != self._told.get(lease.lease_id, ()):
                self._told[lease.lease_id] = gpus
                hint = pb.ParkAtYield(lease_id=lease.lease_id, gpus=gpus)
                self._sessions.notify_parkers(holder, pb.AgentMessage(park_at_yield=hint))
