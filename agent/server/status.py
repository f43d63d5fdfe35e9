"""The agent's /v1/status document: per GPU its holder, fencing token, queue and tenants."""

from __future__ import annotations

from typing import Any

from agent.core.leases import GpuState
from agent.server.service import LeaseService
from agent.server.waits import standing


def status_json(service: LeaseService, now: float) -> dict[str, Any]:
    """A JSON-serialisable picture of the node right now: every GPU it knows (its parking
    backend's, and any a tenant named), a GPU no tenant has named yet as idle."""
    table = service.table
    known = service.parking.gpu_memory if service.parking is not None else {}
    gpus: dict[str, Any] = {}
    for gpu in sorted(table.gpus.keys() | known.keys()):
        named = gpu in table.gpus  # the metrics' reads would add it to the table
        state = table.gpus[gpu] if named else GpuState()
        lease = table.leases.get(state.holder or "")
        gpus[gpu] = {
            "holder": lease.tenant_id if lease else None,
            "lease_id": lease.lease_id if lease else None,
            "fencing_token": state.token,
            "held_s": round(now - lease.granted_at, 6) if lease else None,
            "hold_until": lease.hold_until if lease else None,
            "queue": [
                {
                    "tenant_id": w.tenant_id,
                    "waited_s": round(now - w.enqueued_at, 6),
                    "resuming": w.front,
                    "blocked": w.blocked or None,
                    **standing(table, service.metrics, w, now),
                }
                for w in table.queue_of(gpu)
            ],
            "tenants": sorted(
                t.tenant_id for t in service.tenants.tenants.values() if gpu in t.gpus
            ),
            "busy_seconds": round(service.metrics.busy_seconds(table, gpu, now), 6) if named else 0,
            "duty_last_minute": (
                round(service.metrics.duty_last_minute(table, gpu, now), 4) if named else 0
            ),
        }
    service.account()
    acct = service.metrics.accounting
    tenants = {
        t.tenant_id: {
            **t.to_json(),
            "connected": service.sessions.connected(t.tenant_id),
            "gpu_seconds": round(
                sum(v for k, v in acct.gpu_seconds.items() if k[0] == t.tenant_id), 6
            ),
        }
        for t in service.tenants.tenants.values()
    }
    return {
        "time": now,
        "policy": service.policy_name,
        "max_hold_s": table.max_hold,
        "gpus": gpus,
        "tenants": tenants,
        "residency": service.preparer.status(),
        "accounting": {
            "gpu_seconds_by_namespace": {k: round(v, 6) for k, v in acct.by_namespace().items()},
            **acct.to_json(),
        },
    }
