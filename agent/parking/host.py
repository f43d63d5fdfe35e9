"""The seam between the agent and its parking, both ways: what parking needs of the agent that
runs it (`ParkingHost`), and what the agent's server asks of a preparer that parks (`Parking`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol, runtime_checkable

from agent.core.residency import NoRoom, TurnPreparer
from agent.parking.backends.base import Backend, TenantRef
from agent.parking.metrics import ParkingMetrics


class ParkingHost(Protocol):
    """The agent as the preparer sees it; the lease service implements it."""

    def tenant_refs(self) -> Mapping[str, TenantRef]:
        """The tenants that count now (GPUs, PIDs, limits); a tenant not here is gone. The same
        mapping, unchanged, until they change (the preparer keeps what it found current in it
        while it is the same object)."""
        ...

    def quarantine(self, tenant_id: str, why: str) -> None:
        """The tenant's memory can no longer be moved safely (told once, on the event loop)."""
        ...

    def persist(self) -> None:
        """Memory moved: save the agent's state, the preparer's `durable()` record with it."""
        ...


@runtime_checkable
class Parking(Protocol):
    """A preparer that parks memory, as the server sees it (`ParkingPreparer` implements it)."""

    @property
    def gpu_memory(self) -> Mapping[str, int]:
        """The GPUs it manages and their memory."""
        ...

    @property
    def metrics(self) -> ParkingMetrics:
        """Its moves, refusals and parked bytes, for the agent's /metrics."""
        ...

    def methods(self) -> tuple[str, ...]:
        """The node's parking methods (`agent.parking.methods`), its default first."""
        ...

    def method_of(self, tenant_id: str) -> str:
        """The method that moves the tenant's memory (or would)."""
        ...

    def method_for(self, ref: TenantRef) -> str:
        """The method that moves the tenant `ref` describes, attached or not."""
        ...

    def backend_for(self, method: str) -> Backend:
        """The backend that moves tenants by `method`, one of `methods()`."""
        ...

    async def pin(self, tenant_id: str, method: str) -> None:
        """Move the tenant by `method` until it is resident again, as a move (no other move of
        it meanwhile); `BackendError` if it is parked by another, or has left."""
        ...

    def resident_bytes(self) -> dict[str, int]:
        """Device bytes in use on each GPU."""
        ...

    def not_restored(self, tenant_id: str, parked: Mapping[str, int]) -> None:
        """The tenant's process ends its turn still holding this memory parked (GPU → bytes its
        park moved): a grant that left the restore to it went unused, or the restore failed."""
        ...

    def parks_at_yield(
        self, holder: str, incoming: str, gpus: Collection[str], reserved: int = 0
    ) -> dict[str, int]:
        """GPU → bytes `incoming`'s turn after `holder`'s would park of `holder`, which parks
        itself (its own process moves its memory), within the host budget beside `reserved`;
        empty when none or unknown."""
        ...

    def told_to_park(self, holder: str, gpus: Collection[str], parked: Mapping[str, int]) -> None:
        """The holder of the turn on `gpus` was told to park `parked` (GPU → bytes; empty:
        nothing now) as it yields: the host budget holds them until its turn there ends."""
        ...

    def parked_at_yield(self, tenant_id: str, parked: Mapping[str, int]) -> None:
        """The tenant's process parked this memory itself as its turn ended (GPU → bytes)."""
        ...

    def never_fits(self, tenant_id: str) -> NoRoom | None:
        """`TooLarge` if the tenant declared more memory than one of its GPUs holds: no turn of
        it can ever be granted (None: it may fit)."""
        ...

    def moving(self, tenant_id: str) -> bool:
        """Whether its memory is being moved now (for any turn, or on request)."""
        ...

    async def refresh(self) -> None:
        """Read every tenant from the backend now (its residency and parked bytes)."""
        ...

    async def park(self, tenant_id: str) -> None:
        """Park the tenant now, on request; `NoRoom` if it cannot be, `BackendError` if it has
        left."""
        ...

    async def unpark(self, tenant_id: str) -> None:
        """Restore the tenant now, on request, parking idle others for room; `BackendError` if
        it has left."""
        ...


def parking_of(preparer: TurnPreparer) -> Parking | None:
    """The preparer as a `Parking`, or None where it parks nothing (`--backend none`)."""
    return preparer if isinstance(preparer, Parking) else None
