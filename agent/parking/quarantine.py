"""Tenants whose memory the backend can no longer move safely: they take no more turns."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from agent.parking.backends.base import TenantState
from agent.parking.host import ParkingHost
from agent.parking.metrics import ParkingMetrics

log = logging.getLogger(__name__)


class Quarantines:
    """Why each quarantined tenant is; counted in the metrics, told to the host once."""

    def __init__(self, metrics: ParkingMetrics, host: ParkingHost | None = None) -> None:
        self.metrics = metrics
        self.why: dict[str, str] = {}
        self._host = host

    def note(self, tenant_id: str, why: str) -> None:
        """Remember the quarantine, count it and tell the host (once per tenant)."""
        if tenant_id in self.why:
            return
        self.why[tenant_id] = why
        self.metrics.quarantined.set(len(self.why))
        self.metrics.quarantines.inc()
        log.error("tenant %s is quarantined and takes no more turns: %s", tenant_id, why)
        if self._host is not None:
            self._host.quarantine(tenant_id, why)

    def note_all(self, states: Mapping[str, TenantState]) -> None:
        """Note the quarantines the backend reported in `states`."""
        for tenant_id, st in list(states.items()):
            if st.quarantined:
                self.note(tenant_id, st.quarantined)

    def forget(self, tenant_id: str) -> None:
        """The tenant is gone."""
        if self.why.pop(tenant_id, None) is not None:
            self.metrics.quarantined.set(len(self.why))
