"""NodePrepareResources and NodeUnprepareResources: a claim's CDI spec, its record, its undoing.

`claim_gpus` is pure (a claim object and the inventory in, the GPUs out); `Preparer` reads the
claim from the API, writes the spec, then the record, and answers from the record on a repeat.
The prepares and unprepares of one claim run one at a time (the kubelet may send a pod's
unprepare while another pod sharing the claim is being prepared); different claims' run at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from baton.contract import names
from baton.contract.draclaim import ClaimShare, claim_shares
from baton.contract.kube import api_error_reason
from dra import cdi
from dra.record import ClaimRecord, PreparedClaim, PreparedDevice
from nodegpu.inventory import Inventory, NodeGpu
from nodegpu.state import LiveInventory

log = logging.getLogger(__name__)


class PrepareError(Exception):
    """A claim cannot be prepared here; the message says why, for the pod's events."""


class ClaimLocks:
    """A lock per claim UID, kept while a prepare or unprepare of that claim runs or waits."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    @contextlib.contextmanager
    def held(self, uid: str) -> Iterator[None]:
        """Hold the claim's lock (waiting for the call on it before)."""
        with self._mutex:
            lock, users = self._locks.get(uid, (threading.Lock(), 0))
            self._locks[uid] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._mutex:
                lock, users = self._locks[uid]
                if users == 1:
                    del self._locks[uid]
                else:
                    self._locks[uid] = (lock, users - 1)


class ClaimReader(Protocol):
    """Reads one ResourceClaim (the API server's JSON; None when it is gone)."""

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None: ...


def claim_gpus(
    claim: dict[str, Any], uid: str, node_name: str, inventory: Inventory
) -> list[tuple[ClaimShare, NodeGpu]]:
    """The claim's results on this node's pool and their GPUs; PrepareError says what is off."""
    meta = claim.get("metadata") or {}
    where = f"claim {meta.get('namespace')}/{meta.get('name')}"
    if meta.get("uid") != uid:
        raise PrepareError(f"{where} has UID {meta.get('uid')}, not {uid}: it was replaced")
    shares = [s for s in claim_shares(claim) if s.pool == node_name]
    if not shares:
        raise PrepareError(f"{where} has no device of {names.DRA_DRIVER} on node {node_name}")
    by_name = {names.dra_device_name(g.index): g for g in inventory.gpus}
    found = []
    for share in shares:
        gpu = by_name.get(share.device)
        if gpu is None:
            raise PrepareError(f"{where}: node {node_name} has no device {share.device}")
        if gpu.uuid in inventory.unhealthy:
            raise PrepareError(
                f"{where}: GPU {share.device} ({gpu.uuid}) is unhealthy "
                f"({inventory.unhealthy[gpu.uuid]})"
            )
        too_much = _beyond(share, gpu)
        if too_much:
            raise PrepareError(f"{where}: {too_much} (allocated from an older ResourceSlice?)")
        found.append((share, gpu))
    return found


def _beyond(share: ClaimShare, gpu: NodeGpu) -> str | None:
    """What `share` consumes beyond what its GPU has (the slice's most per share), or None."""
    if share.memory_bytes is not None and share.memory_bytes > gpu.memory_mib * names.MIB:
        return (
            f"its share consumes {share.memory_bytes // names.MIB} MiB of memory of "
            f"{share.device}, which has {gpu.memory_mib} MiB"
        )
    if share.duty is not None and share.duty > 100:
        return f"its share consumes duty {share.duty:g} of {share.device}, which has 100"
    return None


def _replaced(known: PreparedClaim, node_name: str, inventory: Inventory) -> str | None:
    """Which GPU a recorded claim was prepared on that the node no longer has under its device
    name (replaced, or gone), or None: its container must not be given a GPU that is not there."""
    now = {names.dra_device_name(g.index): g.uuid for g in inventory.gpus}
    for device in known.devices:
        uuid = now.get(device.device)
        if uuid == device.gpu:
            continue
        what = f"now {uuid} (replaced)" if uuid else f"which node {node_name} no longer has"
        return (
            f"it was prepared on {device.device} ({device.gpu}), {what}; delete its pods so "
            "that the claim is allocated again"
        )
    return None


def _cdi_ids(uid: str, device: str, gpu: str, vendor_ids: tuple[str, ...]) -> tuple[str, ...]:
    """A result's CDI IDs: its own first (the kubelet names the device's health by it), then the
    claim's (env and mount) with every result, so that a container naming one request of the
    claim gets that request's results' IDs only, then the vendor's for its GPU."""
    return (
        cdi.cdi_id(uid, device),
        cdi.cdi_id(uid),
        *[v for v in vendor_ids if v.endswith(gpu)],
    )


class Preparer:
    """Prepares and unprepares claims on one node."""

    def __init__(
        self,
        node_name: str,
        inventory: LiveInventory,
        claims: ClaimReader,
        record: ClaimRecord,
        spec_dir: Path,
        vendor_kind: str | None = None,
        refusal: Callable[[], str | None] = lambda: None,
        between: Callable[[str], None] = lambda uid: None,
    ) -> None:
        """`refusal()` says why this node cannot apply CDI (checked on every prepare);
        `between(uid)` runs after a claim's spec is written and before it is recorded (the
        fake fault `dra.faults.PrepareHold`)."""
        self.node_name = node_name
        self.inventory = inventory
        self.claims = claims
        self.record = record
        self.spec_dir = spec_dir
        self.vendor_kind = vendor_kind
        self.refusal = refusal
        self.between = between
        self._lock = threading.Lock()
        """Held for each write of a spec or of the record, and to close."""
        self._closed = False
        self._claims_busy = ClaimLocks()

    def close(self) -> None:
        """Write nothing from now on, once a write under way is done: the driver stops, and the
        next one may hold the state directory as soon as it has (a prepare still reading its
        claim would write over that driver's record)."""
        with self._lock:
            self._closed = True

    def _still_open(self, where: str) -> None:
        """PrepareError once closed (called holding `_lock`, right before a write)."""
        if self._closed:
            raise PrepareError(f"{where}: the driver is stopping; another driver prepares it")

    def remove_orphans(self) -> list[Path]:
        """Remove specs no recorded claim owns (a prepare cut before it recorded)."""
        orphans = cdi.orphan_specs(self.spec_dir, self.record.uids())
        for path in orphans:
            path.unlink(missing_ok=True)
            log.info("removed CDI spec %s: no prepared claim owns it", path)
        return orphans

    def prepare(self, namespace: str, uid: str, name: str) -> PreparedClaim:
        """The claim prepared: its spec written and recorded (once; a repeat answers the same)."""
        with self._claims_busy.held(uid):
            return self._prepare(namespace, uid, name)

    def _prepare(self, namespace: str, uid: str, name: str) -> PreparedClaim:
        where = f"claim {namespace}/{name}"
        known = self.record.get(uid)
        if known is not None:
            replaced = _replaced(known, self.node_name, self.inventory.snapshot()[1])
            if replaced:
                raise PrepareError(f"{where}: {replaced}")
            if not cdi.spec_path(self.spec_dir, uid).exists():
                return self._rewrite(known, where)
            return known
        why = self.refusal()
        if why:
            raise PrepareError(f"node {self.node_name} cannot prepare claims: {why}")
        try:
            claim = self.claims.read_claim(namespace, name)
        except Exception as err:  # any API failure: this claim's error, the kubelet retries
            raise PrepareError(f"{where}: cannot read it ({api_error_reason(err)})") from err
        if claim is None:
            raise PrepareError(f"{where}: the claim no longer exists")
        found = claim_gpus(claim, uid, self.node_name, self.inventory.snapshot()[1])
        vendor_ids = self._write(uid, {share.device: gpu.uuid for share, gpu in found}, where)
        devices = tuple(
            PreparedDevice(
                request_names=(share.request,),
                pool=share.pool,
                device=share.device,
                gpu=gpu.uuid,
                cdi_ids=_cdi_ids(uid, share.device, gpu.uuid, vendor_ids),
                share_id=share.share_id,
            )
            for share, gpu in found
        )
        prepared = PreparedClaim(uid, namespace, name, devices)
        self.between(uid)
        self._record(prepared, where)
        log.info(
            "prepared claim %s/%s (%s): %s",
            namespace,
            name,
            uid,
            ", ".join(f"{d.device}={d.gpu} share {d.share_id}" for d in devices),
        )
        return prepared

    def _rewrite(self, known: PreparedClaim, where: str) -> PreparedClaim:
        """A recorded claim's spec written again (lost with /var/run/cdi at a reboot) with the
        settings the driver has now (`--vendor-cdi` may have changed since), and its answer
        derived again with it, so that the two agree; recorded again where the answer changed.
        """
        gpus = {d.device: d.gpu for d in known.devices}
        vendor_ids = self._write(known.uid, gpus, where)
        again = dataclasses.replace(
            known,
            devices=tuple(
                dataclasses.replace(d, cdi_ids=_cdi_ids(known.uid, d.device, d.gpu, vendor_ids))
                for d in known.devices
            ),
        )
        if again != known:
            self._record(again, where)
            log.info("%s (%s) answered anew: the CDI settings changed", where, known.uid)
        return again

    def _record(self, prepared: PreparedClaim, where: str) -> None:
        """Record `prepared`; where it cannot be, remove its spec (nothing stays prepared)."""
        try:
            with self._lock:
                self._still_open(where)  # its spec stays: the next driver's, or an orphan
                self.record.put(prepared)
        except OSError as err:
            cdi.remove_spec(self.spec_dir, prepared.uid)
            raise PrepareError(
                f"{where}: cannot record it in {self.record.path} ({err.strerror or err})"
            ) from err

    def _write(self, uid: str, devices: dict[str, str], where: str) -> tuple[str, ...]:
        spec, vendor_ids = cdi.claim_spec(uid, devices, self.vendor_kind)
        try:
            with self._lock:
                self._still_open(where)
                cdi.write_spec(self.spec_dir, uid, spec)
        except OSError as err:
            raise PrepareError(
                f"{where}: cannot write its CDI spec in {self.spec_dir} ({err.strerror or err})"
            ) from err
        return vendor_ids

    def unprepare(self, namespace: str, uid: str, name: str) -> None:
        """Remove the claim's spec and record (an unknown claim is already unprepared)."""
        with self._claims_busy.held(uid):
            self._unprepare(namespace, uid, name)

    def _unprepare(self, namespace: str, uid: str, name: str) -> None:
        where = f"claim {namespace}/{name}"
        with self._lock:
            self._still_open(where)
            try:
                cdi.remove_spec(self.spec_dir, uid)
            except OSError as err:
                raise PrepareError(
                    f"{where}: cannot remove its CDI spec {cdi.spec_path(self.spec_dir, uid)} "
                    f"({err.strerror or err})"
                ) from err
            try:
                self.record.drop(uid)
            except OSError as err:
                raise PrepareError(
                    f"{where}: cannot drop it from {self.record.path} ({err.strerror or err})"
                ) from err
        log.info("unprepared claim %s/%s (%s)", namespace, name, uid)
