"""The agent's state as JSON: the snapshot's fields, and the journal's entries applied to them
(`agent.node.state` stores both)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from agent.core.leases import Lease
from agent.node.tenants import Tenant

STATE_FORMAT = 1
"""The snapshot's format: an agent refuses a state written in a later one (a downgrade)."""
log = logging.getLogger(__name__)


@dataclass
class PersistedState:
    """Everything that must survive an agent restart."""

    tenants: list[Tenant] = field(default_factory=list)
    leases: list[Lease] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)
    """Last fencing token per GPU (so tokens never repeat after a restart)."""
    parked: dict[str, Any] = field(default_factory=dict)
    """The parking backend's record: per tenant, which processes are parked with how many bytes
    on which GPU, and why a tenant is quarantined (confirmed with the driver after a restart)."""
    parked_from: str = ""
    """Where loading read `parked` (the snapshot's path, or the journal's and its line)."""
    accounting: dict[str, Any] = field(default_factory=dict)
    """GPU-seconds and parked byte-seconds per tenant, namespace and tier (`Accounting`)."""
    replayed: int = 0
    """How many journal entries loading applied over the snapshot (0 when it was complete)."""


def encode(state: PersistedState, journal_seq: int) -> bytes:
    """The snapshot's bytes, complete up to journal entry `journal_seq`."""
    extra = {"format": STATE_FORMAT, "journal_seq": journal_seq}
    return json.dumps(_to_json(state) | extra).encode()


def decode(data: Any) -> tuple[PersistedState, int]:
    """A snapshot read back, and up to which journal entry it is complete."""
    if not isinstance(data, dict):
        raise TypeError(f"a JSON {type(data).__name__}, not an object")
    state = PersistedState(
        tenants=[Tenant.from_json(t) for t in data.get("tenants", [])],
        leases=[lease_from_json(x) for x in data.get("leases", [])],
        tokens={k: int(v) for k, v in data.get("tokens", {}).items()},
        parked=dict(data.get("parked", {})),
        accounting=dict(data.get("accounting", {})),
    )
    return state, int(data.get("journal_seq", 0))


def apply_entry(
    entry: dict[str, Any],
    state: PersistedState,
    tenants: dict[str, Tenant],
    leases: dict[str, Lease],
) -> dict[str, Lease]:
    """One journal entry applied to `state`, `tenants` and `leases` (returned)."""
    if "tenant" in entry:
        tenant = Tenant.from_json(entry["tenant"])
        tenants[tenant.tenant_id] = tenant
    elif "grant" in entry:
        lease = lease_from_json(entry["grant"])
        for gpu, token in lease.tokens.items():
            state.tokens[gpu] = max(state.tokens.get(gpu, 0), token)
        if lease.tenant_id in tenants:
            leases[lease.lease_id] = lease
        else:  # a journal from before tenants were journaled
            log.warning(
                "journal: lease %s of tenant %s, whom the snapshot lacks, is dropped",
                lease.lease_id,
                lease.tenant_id,
            )
    elif "gone" in entry:
        gone = str(entry["gone"])
        tenants.pop(gone, None)
        leases = {k: x for k, x in leases.items() if x.tenant_id != gone}
    elif "parked" in entry:
        state.parked = dict(entry["parked"])
    elif "end" in entry:
        leases.pop(str(entry["end"]), None)
    else:
        raise KeyError(f"none of tenant, grant, gone, parked, end in {sorted(entry)}")
    return leases


def _to_json(state: PersistedState) -> dict[str, Any]:
    return {
        "tenants": [t.to_json() for t in state.tenants],
        "leases": [lease_to_json(x) for x in state.leases],
        "tokens": dict(state.tokens),
        "parked": state.parked,
        "accounting": state.accounting,
    }


def lease_to_json(lease: Lease) -> dict[str, Any]:
    return {
        "lease_id": lease.lease_id,
        "tenant_id": lease.tenant_id,
        "gpus": list(lease.gpus),
        "tokens": dict(lease.tokens),
        "granted_at": lease.granted_at,
        "hold_until": lease.hold_until,
    }


def lease_from_json(data: dict[str, Any]) -> Lease:
    return Lease(
        lease_id=data["lease_id"],
        tenant_id=data["tenant_id"],
        gpus=tuple(data["gpus"]),
        tokens={k: int(v) for k, v in data["tokens"].items()},
        granted_at=float(data["granted_at"]),
        hold_until=float(data["hold_until"]),
    )
