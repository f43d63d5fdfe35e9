"""The agent's durable state: tenants, leases, fencing tokens and parked processes, one JSON
file, atomic writes.

Writes happen off the event loop, a newer state replacing an unwritten one, so the file
trails the live state by at most one write (about a millisecond).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.core.leases import Lease
from agent.node.tenants import Tenant

STATE_FILE = "agent-state.json"
PROBE_BYTES = 64 * 1024
"""Written (then removed) at start: a state directory must hold a state file of this size."""
log = logging.getLogger(__name__)


class StateDirError(Exception):
    """The state directory cannot be used."""


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
    accounting: dict[str, Any] = field(default_factory=dict)
    """GPU-seconds and parked byte-seconds per tenant, namespace and tier (`Accounting`)."""


class StateStore:
    """Reads and writes the state in `state_dir`."""

    def __init__(self, state_dir: str | Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE
        self._cond = threading.Condition()
        self._latest: bytes | None = None
        self._writing = False
        self._thread: threading.Thread | None = None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.dir, prefix=".probe-") as probe:
                probe.write(b"\0" * PROBE_BYTES)  # creating an empty file works on a full disk
                probe.flush()
                os.fsync(probe.fileno())
        except OSError as exc:
            raise StateDirError(
                f"state directory {self.dir} is not writable ({exc.strerror}); "
                "pass --state-dir (BATON_AGENT_STATE_DIR) pointing at a writable directory"
            ) from exc

    def load(self) -> PersistedState:
        """The last saved state, or an empty one."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return PersistedState()
        except (OSError, ValueError) as exc:
            raise StateDirError(
                f"cannot read {self.path}: {exc}; move it aside to start afresh"
            ) from exc
        return PersistedState(
            tenants=[Tenant.from_json(t) for t in data.get("tenants", [])],
            leases=[_lease_from_json(x) for x in data.get("leases", [])],
            tokens={k: int(v) for k, v in data.get("tokens", {}).items()},
            parked=dict(data.get("parked", {})),
            accounting=dict(data.get("accounting", {})),
        )

    def save(self, state: PersistedState) -> None:
        """Write the state now: a temp file in the same directory, renamed over the old one."""
        self._write(_encode(state))

    def save_soon(self, state: PersistedState) -> None:
        """Write the state from a background thread; a newer one replaces an unwritten one.

        It is encoded here, so the writer holds the GIL only briefly between its system calls
        (a long hold would stall the event loop's next grant for up to a switch interval).
        """
        data = _encode(state)
        with self._cond:
            self._latest = data
            if self._thread is None:
                self._thread = threading.Thread(target=self._writer, name="state", daemon=True)
                self._thread.start()
            self._cond.notify()

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until everything handed to `save_soon` is on disk."""
        with self._cond:
            self._cond.wait_for(lambda: self._latest is None and not self._writing, timeout)

    def _writer(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._latest is not None)
                data, self._latest, self._writing = self._latest, None, True
            try:
                self._write(data or b"{}")
            except OSError as exc:
                log.error("cannot write agent state to %s: %s", self.path, exc)
            with self._cond:
                self._writing = False
                self._cond.notify_all()

    def _write(self, data: bytes) -> None:
        tmp = self.dir / f".{STATE_FILE}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, self.path)


def _encode(state: PersistedState) -> bytes:
    return json.dumps(_to_json(state)).encode()


def _to_json(state: PersistedState) -> dict[str, Any]:
    return {
        "tenants": [t.to_json() for t in state.tenants],
        "leases": [_lease_to_json(x) for x in state.leases],
        "tokens": dict(state.tokens),
        "parked": state.parked,
        "accounting": state.accounting,
    }


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
