"""Tenants from the pods on this node: a watch on the API server (field selector on the node).

`pod_tenant` is pure (a pod object in, a `Tenant` or None out); `PodWatcher` is the store the
contract's reflector feeds from its thread, and hands each change to the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from agent.node.draview import DraHolding, DraView
from agent.node.tenants import POD, Tenant
from baton.contract import names
from baton.contract.annotations import decode_parking, pod_assignment
from baton.contract.draapi import DraApi
from baton.contract.kube import Outage
from baton.contract.podask import RequestError, TenantRequest, parse_pod_request
from baton.contract.reflector import KubeSource, Reflector, WatchEvent

log = logging.getLogger(__name__)

_DONE_PHASES = ("Succeeded", "Failed")
REQUEST_TIMEOUT_S = 10.0
"""A list's answer, and a connection to the API server, must come within this."""


def pod_tenant(pod: Mapping[str, Any], dra: DraHolding | None = None) -> Tenant | None:
    """The tenant a pod (the API server's JSON) is, or None if it has no Baton GPUs assigned
    (or has finished).

    Its GPUs are what the kubelet allocated to its containers once the device plugin has
    recorded that (`baton.dev/container-gpus`), until then the extender's proposal; on the
    DRA path (`dra`), its claims' devices, with the memory and duty its claims consumed.
    """
    meta, status = pod.get("metadata") or {}, pod.get("status")
    assignment = pod_assignment(meta.get("annotations") or {})
    per_container = dict(assignment.container_gpus)
    allocated = {g for each in per_container.values() for g in each}
    gpus = tuple(sorted(allocated or set(assignment.assigned_gpus)))
    from_claims = not gpus and dra is not None
    if from_claims and dra is not None:
        per_container = dict(dra.container_gpus)
        gpus = tuple(sorted({g for each in per_container.values() for g in each}))
    if not gpus or (status or {}).get("phase") in _DONE_PHASES:
        return None
    request = _request(pod) or TenantRequest(len(gpus))
    if from_claims and dra is not None:
        request = TenantRequest(len(gpus), dra.memory_mib, dra.duty, request.memory_limit_bytes)
    labels = meta.get("labels") or {}
    return Tenant(
        tenant_id=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        name=meta.get("name", ""),
        gpus=gpus,
        gpu_memory_mib=request.memory_mib or 0,
        gpu_duty=int(request.duty or 0) or 100,
        memory_limit_bytes=request.memory_limit_bytes or 0,
        priority=_priority(pod),
        source=POD,
        pod_uid=meta.get("uid", ""),
        labels={k: v for k, v in labels.items() if _kept(k)},
        container_gpus=per_container,
        containers=_container_ids(status or {}),
        parking=decode_parking(meta.get("annotations") or {}),
    )


def _kept(label: str) -> bool:
    """The pod labels a tenant keeps: llm-d's `timeslice.io/*` and Baton's job."""
    return label.startswith(names.LABEL_PREFIX_LLMD) or label == names.LABEL_JOB


def _priority(pod: Mapping[str, Any]) -> int:
    """The pod's priority (set from its PriorityClass by the API server); 0 when absent."""
    value = (pod.get("spec") or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _request(pod: Mapping[str, Any]) -> TenantRequest | None:
    """The pod's ask (`baton.contract.podask`); an unusable one is logged and the defaults hold."""
    try:
        return parse_pod_request(pod)
    except RequestError as err:
        meta = pod.get("metadata") or {}
        log.warning(
            "pod %s/%s: %s; it takes turns with the defaults",
            meta.get("namespace"),
            meta.get("name"),
            err,
        )
        return None


def _container_ids(status: Mapping[str, Any]) -> dict[str, str]:
    """Container ID (without its `containerd://` scheme) → name, from the pod's status."""
    found = {}
    for each in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        if each.get("containerID"):
            found[each["containerID"].rpartition("://")[2]] = each.get("name", "")
    return found


class PodWatcher:
    """Keeps the agent's pod tenants in step with the pods bound to `node_name` (a store for
    the contract's reflector, which lists and watches)."""

    def __init__(
        self,
        api_client: Any,
        node_name: str,
        loop: asyncio.AbstractEventLoop,
        upsert: Callable[[Tenant], None],
        remove: Callable[[str], None],
        known: dict[str, str] | None = None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        dra: DraView | None = None,
    ) -> None:
        """`dra` reads pods' claims (by default through `api_client`)."""
        self._loop = loop
        self._dra = dra or DraView(DraApi(api_client, node_name), node_name)
        self._upsert = upsert
        self._remove = remove
        self._known = dict(known or {})
        """Pod UID → tenant id of the pod tenants the agent has (restored ones included)."""
        self.listed = False
        """The node's pods were listed once and handed to the loop (read it on the loop)."""
        outage = Outage(
            log,
            f"watch of node {node_name}'s pods",
            "tenants in new pods are not recognised (their Register is refused) and pods that "
            "leave keep their tenants",
        )
        source = KubeSource(api_client, "pods", field_selector=f"spec.nodeName={node_name}")
        self._reflector = Reflector(
            source, self, outage, name="podwatch", request_timeout_s=request_timeout_s
        )

    def start(self) -> None:
        """Begin listing and watching in the background."""
        self._reflector.start()

    def stop(self) -> None:
        """Stop watching and wait (bounded) for the thread, which must be gone before the
        interpreter exits."""
        self._reflector.stop()

    def replace(self, objects: list[dict[str, Any]], resource_version: str) -> None:
        """A full list: pods not in it are gone (restored tenants whose pod left included)."""
        seen = set()
        for pod in objects:
            seen.add((pod.get("metadata") or {}).get("uid", ""))
            self._apply("MODIFIED", pod)
        for uid in set(self._known) - seen:
            self._gone(uid)
        self._loop.call_soon_threadsafe(self._mark_listed)  # after the changes it queued

    def _mark_listed(self) -> None:
        self.listed = True

    def apply(self, event: WatchEvent) -> None:
        """One change the watch saw."""
        self._apply(event.type, event.object)

    def _apply(self, kind: str, pod: Mapping[str, Any]) -> None:
        uid = (pod.get("metadata") or {}).get("uid", "")
        if kind == "DELETED":
            self._dra.forget(uid)
            self._gone(uid)
            return
        tenant = pod_tenant(pod, self._dra.holding(pod))
        if tenant is None:
            self._gone(uid)
            return
        self._known[uid] = tenant.tenant_id
        self._loop.call_soon_threadsafe(self._upsert, tenant)

    def _gone(self, uid: str) -> None:
        tenant_id = self._known.pop(uid, None)
        if tenant_id is not None:
            self._loop.call_soon_threadsafe(self._remove, tenant_id)
