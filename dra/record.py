"""The driver's record of prepared claims: a JSON file that survives the driver's restarts.

NodeUnprepareResources names only the claim; what was prepared for it is read from here.
Every change is written to a temporary file, synced and renamed over the record:
`{"format": 1, "claims": {UID: claim}}`. A record without a format number (the claims by UID
alone) is read as format 1; one of a higher format, which a newer driver wrote, is refused
rather than misread.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

RECORD_FILE = "prepared-claims.json"
FORMAT = 1
"""The record's format number; a change to what a claim records raises it."""


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
            raw = _claims_by_uid(json.loads(self.path.read_text()))
            return {uid: _claim(uid, entry) for uid, entry in raw.items()}
        except ValueError as err:
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
            self._save({**self._claims, claim.uid: claim})

    def drop(self, uid: str) -> None:
        """Forget a claim (durably); unknown UIDs are fine."""
        with self._lock:
            if uid in self._claims:
                self._save({k: c for k, c in self._claims.items() if k != uid})

    def _save(self, claims: dict[str, PreparedClaim]) -> None:
        """Write `claims` durably, then hold them: a failed write (OSError) changes nothing,
        so a retry fails the same way rather than answer from what was never written."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as out:
            entries = {uid: asdict(c) for uid, c in claims.items()}
            json.dump({"format": FORMAT, "claims": entries}, out)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(self.path)
        self._claims = claims


def _claims_by_uid(raw: object) -> dict[str, object]:
    """The claims of a record of this driver's format (or of none: the claims alone)."""
    if not isinstance(raw, dict):
        raise ValueError(f"a JSON {type(raw).__name__}, not an object of claims by UID")
    if "format" not in raw:
        return raw
    number = raw["format"]
    if type(number) is not int or number < 1:
        raise ValueError(f"format {number!r} is not a format number")
    if number > FORMAT:
        raise ValueError(
            f"format {number} was written by a newer driver; this one reads format {FORMAT}"
        )
    claims = raw.get("claims")
    if not isinstance(claims, dict):
        raise ValueError("claims is not an object of claims by UID")
    return claims


def _claim(uid: str, entry: object) -> PreparedClaim:
    """One recorded claim, every field of the type the driver writes (ValueError otherwise)."""
    fields = _fields(entry, f"claim {uid}", ("uid", "namespace", "name", "devices"))
    if fields["uid"] != uid:
        raise ValueError(f"claim {uid} is recorded under UID {fields['uid']!r}")
    devices = fields["devices"]
    if not isinstance(devices, list):
        raise ValueError(f"claim {uid}: devices is not a list")
    return PreparedClaim(
        uid=uid,
        namespace=_text(fields, "namespace", f"claim {uid}"),
        name=_text(fields, "name", f"claim {uid}"),
        devices=tuple(_device(d, f"claim {uid} device {i}") for i, d in enumerate(devices)),
    )


def _device(entry: object, where: str) -> PreparedDevice:
    fields = _fields(entry, where, ("request_names", "pool", "device", "gpu", "cdi_ids"))
    share = fields.get("share_id")
    if share is not None and not isinstance(share, str):
        raise ValueError(f"{where}: share_id is not a string")
    return PreparedDevice(
        request_names=_texts(fields, "request_names", where),
        pool=_text(fields, "pool", where),
        device=_text(fields, "device", where),
        gpu=_text(fields, "gpu", where),
        cdi_ids=_texts(fields, "cdi_ids", where),
        share_id=share,
    )


def _fields(entry: object, where: str, needed: tuple[str, ...]) -> dict[str, object]:
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is not an object")
    missing = [key for key in needed if key not in entry]
    if missing:
        raise ValueError(f"{where} has no {', '.join(missing)}")
    return entry


def _text(fields: dict[str, object], key: str, where: str) -> str:
    value = fields[key]
    if not isinstance(value, str):
        raise ValueError(f"{where}: {key} is not a string")
    return value


def _texts(fields: dict[str, object], key: str, where: str) -> tuple[str, ...]:
    value = fields[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: {key} is not a list of strings")
    return tuple(value)
