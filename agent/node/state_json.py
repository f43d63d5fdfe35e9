"""The agent's state as JSON: the snapshot's fields, and the journal's entries applied to them
(`agent.node.state` stores both)."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _text
from typing import Any

from agent.core.fairsave import FairLags
from agent.core.leases import Lease
from agent.node.tenants import Tenant

STATE_FORMAT = 2
"""The newest snapshot format this agent reads: it refuses a state written in a later one (a
downgrade). A snapshot is written in the oldest format that holds it (`snapshot_format`)."""
RESUMES_FORMAT = 2
"""The format of a snapshot that keeps revoked tenants' places in the queue (`resumes`): an agent
older than them would drop them unread, so it refuses the file, naming the format, instead."""
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SavedResume:
    """A revoked tenant queued first for the turn after (`agent.server.resumes`): its waiter's
    id (the id of the lease it becomes), and the revoked lease ids it gives back."""

    waiter_id: str
    tenant_id: str
    gpus: tuple[str, ...]
    revoked: tuple[str, ...] = ()


@dataclass
class PersistedState:
    """Everything that must survive an agent restart."""

    tenants: list[Tenant] = field(default_factory=list)
    leases: list[Lease] = field(default_factory=list)
    resumes: dict[str, SavedResume] = field(default_factory=dict)
    """The revoked tenants waiting to be given their turn back, by waiter id."""
    given: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Leases that gave revoked tenants their turns back → the revoked lease ids they follow
    (a client that never heard of the grant names one of those)."""
    tokens: dict[str, int] = field(default_factory=dict)
    """Last fencing token per GPU (so tokens never repeat after a restart)."""
    parked: dict[str, Any] = field(default_factory=dict)
    """The parking backend's record: per tenant, which processes are parked with how many bytes
    on which GPU, and why a tenant is quarantined (confirmed with the driver after a restart)."""
    parked_from: str = ""
    """Where loading read `parked` (the snapshot's path, or the journal's and its line)."""
    accounting: dict[str, Any] = field(default_factory=dict)
    """GPU-seconds and parked byte-seconds per tenant, namespace and tier (`Accounting`)."""
    fair: FairLags = field(default_factory=FairLags)
    """The fair policy's tenants' lags, departed debts and minimum-share balances (absent from
    a state file written before they were kept, or under another policy: empty)."""
    replayed: int = 0
    """How many journal entries loading applied over the snapshot (0 when it was complete)."""


def encode(state: PersistedState, journal_seq: int) -> bytes:
    """The snapshot's bytes, complete up to journal entry `journal_seq`."""
    extra = {"format": snapshot_format(state), "journal_seq": journal_seq}
    return json.dumps(_to_json(state) | extra).encode()


def snapshot_format(state: PersistedState) -> int:
    """The oldest format that holds `state`: 1 (which an agent one version older reads, losing
    nothing) unless it keeps a revoked tenant's place in the queue."""
    return RESUMES_FORMAT if state.resumes or state.given else 1


def decode(data: Any) -> tuple[PersistedState, int]:
    """A snapshot read back, and up to which journal entry it is complete."""
    if not isinstance(data, dict):
        raise TypeError(f"a JSON {type(data).__name__}, not an object")
    state = PersistedState(
        tenants=[Tenant.from_json(t) for t in data.get("tenants", [])],
        leases=[lease_from_json(x) for x in data.get("leases", [])],
        resumes={r.waiter_id: r for r in map(resume_from_json, data.get("resumes", []))},
        given={k: tuple(map(str, v)) for k, v in data.get("given", {}).items()},
        tokens={k: int(v) for k, v in data.get("tokens", {}).items()},
        parked=dict(data.get("parked", {})),
        accounting=dict(data.get("accounting", {})),
        fair=FairLags.from_json(data.get("fair", {})),
    )
    return state, int(data.get("journal_seq", 0))


def apply_entry(
    entry: dict[str, Any],
    state: PersistedState,
    tenants: dict[str, Tenant],
    leases: dict[str, Lease],
) -> dict[str, Lease]:
    """One journal entry applied to `state`, `tenants` and `leases` (returned)."""
    resumes = state.resumes
    if "tenant" in entry:
        tenant = Tenant.from_json(entry["tenant"])
        tenants[tenant.tenant_id] = tenant
    elif "grant" in entry:
        lease = lease_from_json(entry["grant"])
        for gpu, token in lease.tokens.items():
            state.tokens[gpu] = max(state.tokens.get(gpu, 0), token)
        resume = resumes.pop(lease.lease_id, None)  # a resume granted
        if resume is not None and resume.revoked:
            state.given[lease.lease_id] = resume.revoked
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
        state.resumes = {k: r for k, r in resumes.items() if r.tenant_id != gone}
    elif "parked" in entry:
        state.parked = dict(entry["parked"])
    elif "resume" in entry:
        resume = resume_from_json(entry["resume"])
        resumes[resume.waiter_id] = resume
    elif "end" in entry:  # a turn, or a resume that left the queue
        leases.pop(str(entry["end"]), None)
        resumes.pop(str(entry["end"]), None)
        state.given.pop(str(entry["end"]), None)
    else:
        raise KeyError(f"none of tenant, grant, gone, parked, resume, end in {sorted(entry)}")
    return leases


def _to_json(state: PersistedState) -> dict[str, Any]:
    resumes = [resume_to_json(r) for r in state.resumes.values()]
    return {
        "tenants": [t.to_json() for t in state.tenants],
        "leases": [lease_to_json(x) for x in state.leases],
        **({"resumes": resumes} if resumes else {}),  # format 1 has none
        **({"given": {k: list(v) for k, v in state.given.items()}} if state.given else {}),
        "tokens": dict(state.tokens),
        "parked": state.parked,
        "accounting": state.accounting,
        **({"fair": state.fair.to_json()} if state.fair else {}),  # an older agent ignores it
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


def resume_to_json(resume: SavedResume) -> dict[str, Any]:
    return {
        "waiter_id": resume.waiter_id,
        "tenant_id": resume.tenant_id,
        "gpus": list(resume.gpus),
        "revoked": list(resume.revoked),
    }


def resume_from_json(data: dict[str, Any]) -> SavedResume:
    return SavedResume(
        waiter_id=str(data["waiter_id"]),
        tenant_id=str(data["tenant_id"]),
        gpus=tuple(map(str, data["gpus"])),
        revoked=tuple(map(str, data.get("revoked", ()))),
    )


def journal_line(entry: dict[str, Any], seq: int) -> bytes:
    """One journal line: `entry` with its `seq`, as `json.dumps` writes it. A grant (`{"grant":
    Lease}`) and an end, the entries of every handover, are written without the encoder, which
    runs slowly on a CPU that was idle through the turn: the grant waits for this line."""
    if len(entry) == 1:
        ((kind, value),) = entry.items()
        if kind == "end" and isinstance(value, str):
            return f'{{"end": {_text(value)}, "seq": {seq}}}\n'.encode()
        if kind == "grant" and isinstance(value, Lease) and _finite(value):
            return _grant_line(value, seq)
        if isinstance(value, Lease):
            entry = {kind: lease_to_json(value)}
        elif isinstance(value, SavedResume):
            entry = {kind: resume_to_json(value)}
    return json.dumps({**entry, "seq": seq}).encode() + b"\n"


def _finite(lease: Lease) -> bool:
    return math.isfinite(lease.granted_at) and math.isfinite(lease.hold_until)


def _grant_line(lease: Lease, seq: int) -> bytes:
    gpus = ", ".join(map(_text, lease.gpus))
    tokens = ", ".join(f"{_text(gpu)}: {int(token)}" for gpu, token in lease.tokens.items())
    return (
        f'{{"grant": {{"lease_id": {_text(lease.lease_id)}, "tenant_id": '
        f'{_text(lease.tenant_id)}, "gpus": [{gpus}], "tokens": {{{tokens}}}, "granted_at": '
        f'{float(lease.granted_at)!r}, "hold_until": {float(lease.hold_until)!r}}}, '
        f'"seq": {seq}}}\n'
    ).encode()


def lease_from_json(data: dict[str, Any]) -> Lease:
    return Lease(
        lease_id=data["lease_id"],
        tenant_id=data["tenant_id"],
        gpus=tuple(data["gpus"]),
        tokens={k: int(v) for k, v in data["tokens"].items()},
        granted_at=float(data["granted_at"]),
        hold_until=float(data["hold_until"]),
    )
