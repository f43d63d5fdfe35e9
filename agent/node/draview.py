"""A pod's GPUs and share on the DRA path, from its claims' allocations and the node's slice.

On a DRA node no device plugin or extender annotates the pod: what it holds is in its
ResourceClaims (device, memory, duty per result), and the GPU behind each device is named by
the driver's ResourceSlice. `DraView` reads both through the contract (`draclaim`) and keeps
each pod's answer while the pod lives: an allocated claim does not change under its pods.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from baton.contract.draclaim import (
    ClaimRef,
    ClaimShare,
    claim_shares,
    device_uuids,
    pod_claim_refs,
    pod_dra_ask,
)

log = logging.getLogger(__name__)


class ClaimsApi(Protocol):
    """The two reads the view needs (`baton.contract.draapi.DraApi`, or a test's store)."""

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def list_slices(self) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class DraHolding:
    """What a pod holds through Baton's driver on this node."""

    container_gpus: dict[str, tuple[str, ...]]
    """Container name → GPU UUIDs, sorted."""
    memory_mib: int | None
    duty: float | None


class DraView:
    """Pod → its DRA holding on `node_name` (None when it holds nothing of Baton's)."""

    def __init__(self, api: ClaimsApi, node_name: str) -> None:
        self.api = api
        self.node_name = node_name
        self._uuids: dict[str, str] = {}
        self._held: dict[str, DraHolding | None] = {}
        self._lock = threading.Lock()
        self._warned = False

    def holding(self, pod: Mapping[str, Any]) -> DraHolding | None:
        """The pod's holding; read once its claims are all allocated, then remembered.

        An API failure is logged and answers None: the pod's next change reads again.
        """
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        with self._lock:
            if uid in self._held:
                return self._held[uid]
        refs = pod_claim_refs(pod)
        if not refs:
            return None
        try:
            ready, found = self._read(refs)
        except Exception as err:  # any API failure: the next event of the pod retries
            if getattr(err, "status", None) == 403:
                self._denied(uid, err)
                return None
            meta = pod.get("metadata") or {}
            log.warning(
                "pod %s/%s: cannot read its claims (%s); retried on its next change",
                meta.get("namespace"),
                meta.get("name"),
                err,
            )
            return None
        if ready:
            with self._lock:
                self._held[uid] = found
        return found

    def _denied(self, uid: str, err: Exception) -> None:
        """No right to read claims (a device-plugin install): the pod holds nothing of ours."""
        with self._lock:
            self._held[uid] = None
            first, self._warned = not self._warned, True
        if first:
            log.warning(
                "cannot read ResourceClaims (%s): pods with claims are not tenants here; "
                "the DRA install (manifests/overlays/dra) grants the agent this",
                str(err).splitlines()[0],
            )

    def forget(self, pod_uid: str) -> None:
        """The pod is gone."""
        with self._lock:
            self._held.pop(pod_uid, None)

    def _read(self, refs: Mapping[str, tuple[ClaimRef, ...]]) -> tuple[bool, DraHolding | None]:
        """Whether every claim is allocated, and then the holding (None: none of Baton's)."""
        shares: dict[ClaimRef, tuple[ClaimShare, ...]] = {}
        for ref in {r for each in refs.values() for r in each}:
            claim = self.api.read_claim(ref.namespace, ref.name)
            allocated = ((claim or {}).get("status") or {}).get("allocation")
            if not allocated:
                return False, None
            shares[ref] = claim_shares(claim or {})
        ask = pod_dra_ask(refs, shares, self.node_name)
        if not ask.container_devices:
            return True, None
        wanted = {d for each in ask.container_devices.values() for d in each}
        if not wanted <= self._uuids.keys():
            self._uuids = device_uuids(self.api.list_slices())
        missing = sorted(wanted - self._uuids.keys())
        if missing:
            raise LookupError(f"no GPU UUID for {', '.join(missing)} in the node's ResourceSlice")
        gpus = {
            container: tuple(sorted(self._uuids[d] for d in devices))
            for container, devices in ask.container_devices.items()
        }
        return True, DraHolding(gpus, ask.memory_mib, ask.duty)
