"""The driver's record of prepared claims: a JSON file that survives the driver's restarts.

NodeUnprepareResources names only the claim; what was prepared for it is read from here.
Every change is written to a temporary file, synced and renamed over the record.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

RECORD_FILE = "prepared-claims.json"


@dataclass(frozen=True)
class PreparedDevice:
    """One result of a prepared claim, as NodePrepareResources answered it."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    gpu: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class PreparedClaim:
    """A claim this node prepared."""

    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]


class ClaimRecord:
    """Prepared claims by UID, kept in `<state_dir>/prepared-claims.json`."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / RECORD_FILE
        self._lock = threading.Lock()
        self._claims = self._load()

    def _load(self) -> dict[str, PreparedClaim]:
        if not self.path.exists():
            return {}
        try:
            raw = json.loads(self.path.read_text())
            return {uid: _claim(entry) for uid, entry in raw.items()}
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(
                f"the record of prepared claims {self.path} is unreadable ({err}); move it "
                "aside to start afresh (its claims' CDI specs are then removed as orphans)"
            ) from err

    def get(self, uid: str) -> PreparedClaim | None:
        """The prepared claim with this UID, or None."""
        with self._lock:
            return self._claims.get(uid)

    def uids(self) -> list[str]:
        """Every prepared claim's UID."""
        with self._lock:
            return list(self._claims)

    def put(self, claim: PreparedClaim) -> None:
        """Record a prepared claim (durably, before returning)."""
        with self._lock:
            self._claims[claim.uid] = claim
            self._save()

    def drop(self, uid: str) -> None:
        """Forget a claim (durably); unknown UIDs are fine."""
        with self._lock:
            if self._claims.pop(uid, None) is not None:
                self._save()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as out:
            json.dump({uid: asdict(c) for uid, c in self._claims.items()}, out)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(self.path)


def _claim(entry: dict[str, object]) -> PreparedClaim:
    devices = entry["devices"]
    assert isinstance(devices, list)
    return PreparedClaim(
        uid=str(entry["uid"]),
        namespace=str(entry["namespace"]),
        name=str(entry["name"]),
        devices=tuple(
            PreparedDevice(
                request_names=tuple(d["request_names"]),
                pool=d["pool"],
                device=d["device"],
                gpu=d["gpu"],
                cdi_ids=tuple(d["cdi_ids"]),
                share_id=d.get("share_id"),
            )
            for d in devices
        ),
    )
