"""Tenants whose memory the backend can no longer move safely: they take no more turns."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from agent.parking.backends.base import TenantState
from agent.parking.metrics import ParkingMetrics

log = logging.getLogger(__name__)


class Quarantines:
    """Why each quarantined tenant is; counted in the metrics, told to `on_quarantine` once."""

    def __init__(self, metrics: ParkingMetrics) -> None:
        self.metrics = metrics
        self.why: dict[str, str] = {}
        self.on_quarantine: Callable[[str, str], None] | None = None
        """Told (on the event loop) when a tenant is quarantined, and why."""

    def note(self, tenant_id: str, why: str) -> None:
        """Remember the quarantine, count it and tell the lease service (once per tenant)."""
        if tenant_id in self.why:
            return
        self.why[tenant_id] = why
        self.metrics.quarantined.set(len(self.why))
        self.metrics.quarantines.inc()
        log.error("tenant %s is quarantined and takes no more turns: %s", tenant_id, why)
        if self.on_quarantine is not None:
            self.on_quarantine(tenant_id, why)

    def note_all(self, states: Mapping[str, TenantState]) -> None:
        """Note the quarantines the backend reported in `states`."""
        for tenant_id, st in list(states.items()):
            if st.quarantined:
                self.note(tenant_id, st.quarantined)

    def forget(self, tenant_id: str) -> None:
        """The tenant is gone."""
        if self.why.pop(tenant_id, None) is not None:
            self.metrics.quarantined.set(len(self.why))
