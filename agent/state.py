"""The agent's durable state: tenants, leases and fencing tokens, one JSON file, atomic writes."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.leases import Lease
from agent.tenants import Tenant

STATE_FILE = "agent-state.json"


class StateDirError(Exception):
    """The state directory cannot be used."""


@dataclass
class Snapshot:
    """Everything that must survive an agent restart."""

    tenants: list[Tenant] = field(default_factory=list)
    leases: list[Lease] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)
    """Last fencing token per GPU (so tokens never repeat after a restart)."""


class StateStore:
    """Reads and writes the snapshot in `state_dir`."""

    def __init__(self, state_dir: str | Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.dir, prefix=".probe-"):
                pass
        except OSError as exc:
            raise StateDirError(
                f"state directory {self.dir} is not writable ({exc.strerror}); "
                "pass --state-dir (BATON_AGENT_STATE_DIR) pointing at a writable directory"
            ) from exc

    def load(self) -> Snapshot:
        """The last saved snapshot, or an empty one."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return Snapshot()
        except (OSError, ValueError) as exc:
            raise StateDirError(
                f"cannot read {self.path}: {exc}; move it aside to start afresh"
            ) from exc
        return Snapshot(
            tenants=[Tenant.from_json(t) for t in data.get("tenants", [])],
            leases=[_lease_from_json(x) for x in data.get("leases", [])],
            tokens={k: int(v) for k, v in data.get("tokens", {}).items()},
        )

    def save(self, snapshot: Snapshot) -> None:
        """Write the snapshot: a temp file in the same directory, then rename over the old one."""
        data = {
            "tenants": [t.to_json() for t in snapshot.tenants],
            "leases": [_lease_to_json(x) for x in snapshot.leases],
            "tokens": snapshot.tokens,
        }
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".state-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _lease_to_json(lease: Lease) -> dict[str, Any]:
    return {
        "lease_id": lease.lease_id,
        "tenant_id": lease.tenant_id,
        "gpus": list(lease.gpus),
        "tokens": dict(lease.tokens),
        "granted_at": lease.granted_at,
        "hold_until": lease.hold_until,
    }


def _lease_from_json(data: dict[str, Any]) -> Lease:
    return Lease(
        lease_id=data["lease_id"],
        tenant_id=data["tenant_id"],
        gpus=tuple(data["gpus"]),
        tokens={k: int(v) for k, v in data["tokens"].items()},
        granted_at=float(data["granted_at"]),
        hold_until=float(data["hold_until"]),
    )
