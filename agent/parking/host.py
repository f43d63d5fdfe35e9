"""What parking needs of the agent that runs it: its tenants, and someone to tell what happened."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from agent.parking.backends.base import TenantRef


class ParkingHost(Protocol):
    """The agent as the preparer sees it; the lease service implements it."""

    def tenant_refs(self) -> Mapping[str, TenantRef]:
        """The tenants that count now (GPUs, PIDs, limits); a tenant not here is gone."""
        ...

    def quarantine(self, tenant_id: str, why: str) -> None:
        """The tenant's memory can no longer be moved safely (told once, on the event loop)."""
        ...

    def persist(self) -> None:
        """Memory moved: save the agent's state, the preparer's `durable()` record with it."""
        ...
