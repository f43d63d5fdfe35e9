"""Tenants from the pods on this node: a watch on the API server (field selector on the node).

`pod_tenant` is pure (a pod object in, a `Tenant` or None out); `PodWatcher` runs list+watch in
a thread and hands each change to the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from agent.node.tenants import POD, Tenant
from baton import names
from baton.kube import Outage

log = logging.getLogger(__name__)

_DONE_PHASES = ("Succeeded", "Failed")


def _quantity(value: Any) -> float:
    from kubernetes.utils import parse_quantity

    return float(parse_quantity(str(value)))


def container_gpus(text: str | None) -> dict[str, tuple[str, ...]]:
    """The `baton.dev/container-gpus` annotation (the kubelet's allocation); {} if absent or bad."""
    try:
        data = json.loads(text or "{}")
    except ValueError:
        log.warning("ignoring a malformed %s annotation: %r", names.ANNOTATION_CONTAINER_GPUS, text)
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(c): tuple(sorted(map(str, g))) for c, g in data.items() if isinstance(g, list)}


def pod_tenant(pod: Any) -> Tenant | None:
    """The tenant a pod is, or None if it has no Baton GPUs assigned (or has finished).

    Its GPUs are what the kubelet allocated to its containers once the device plugin has
    recorded that (`baton.dev/container-gpus`), until then the extender's proposal.
    """
    meta, spec, status = pod.metadata, pod.spec, pod.status
    annotations = meta.annotations or {}
    per_container = container_gpus(annotations.get(names.ANNOTATION_CONTAINER_GPUS))
    proposed = annotations.get(names.ANNOTATION_ASSIGNED_GPUS, "").split(",")
    allocated = {g for each in per_container.values() for g in each}
    gpus = tuple(sorted(allocated or {g.strip() for g in proposed if g.strip()}))
    if not gpus or (status is not None and status.phase in _DONE_PHASES):
        return None
    memory_mib = duty = memory_limit = 0
    for container in spec.containers or []:
        resources = container.resources
        wanted = {
            **((resources and resources.requests) or {}),
            **((resources and resources.limits) or {}),
        }
        memory_mib += int(_quantity(wanted.get(names.RESOURCE_GPU_MEMORY, 0)))
        duty = max(duty, int(_quantity(wanted.get(names.RESOURCE_GPU_DUTY, 0))))
        limits = (resources and resources.limits) or {}
        memory_limit += int(_quantity(limits.get("memory", 0)))
    return Tenant(
        tenant_id=f"{meta.namespace}/{meta.name}",
        name=meta.name,
        gpus=gpus,
        gpu_memory_mib=memory_mib,
        gpu_duty=duty or 100,
        memory_limit_bytes=memory_limit,
        source=POD,
        pod_uid=meta.uid,
        labels={
            k: v for k, v in (meta.labels or {}).items() if k.startswith(names.LABEL_PREFIX_LLMD)
        },
        container_gpus=per_container,
        containers=_container_ids(status),
    )


def _container_ids(status: Any) -> dict[str, str]:
    """Container ID (without its `containerd://` scheme) → name, from the pod's status."""
    if status is None:
        return {}
    found = {}
    for each in [*(status.init_container_statuses or []), *(status.container_statuses or [])]:
        if each.container_id:
            found[each.container_id.rpartition("://")[2]] = each.name
    return found


class PodWatcher:
    """Keeps the agent's pod tenants in step with the pods bound to `node_name`."""

    def __init__(
        self,
        api_client: Any,
        node_name: str,
        loop: asyncio.AbstractEventLoop,
        upsert: Callable[[Tenant], None],
        remove: Callable[[str], None],
        known: dict[str, str] | None = None,
    ) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._selector = f"spec.nodeName={node_name}"
        self._loop = loop
        self._upsert = upsert
        self._remove = remove
        self._known = dict(known or {})
        """Pod UID → tenant id of the pod tenants the agent has (restored ones included)."""
        self._outage = Outage(
            log,
            f"watch of node {node_name}'s pods",
            "tenants in new pods are not recognised (their Register is refused) and pods that "
            "leave keep their tenants",
        )
        self._stop = threading.Event()
        self._watch: Any = None
        self._thread = threading.Thread(target=self._run, name="podwatch", daemon=True)

    def start(self) -> None:
        """Begin listing and watching in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop watching."""
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        delay = 0.5
        while not self._stop.is_set():
            try:
                version = self._relist()
                self._outage.answered()
                self._watch = watch.Watch()
                for item in self._watch.stream(
                    self._core.list_pod_for_all_namespaces,
                    field_selector=self._selector,
                    resource_version=version,
                    timeout_seconds=300,
                ):
                    self._apply(item["type"], item["object"])
                delay = 0.5
            except ApiException as exc:
                if exc.status != 410:
                    self._outage.failed(exc, delay)
                    self._stop.wait(delay)
                    delay = min(30.0, delay * 2)
            except Exception as exc:  # connection errors of any kind: back off and relist
                self._outage.failed(exc, delay)
                self._stop.wait(delay)
                delay = min(30.0, delay * 2)

    def _relist(self) -> str:
        pods: Any = self._core.list_pod_for_all_namespaces(field_selector=self._selector)
        seen = set()
        for pod in pods.items:
            seen.add(pod.metadata.uid)
            self._apply("MODIFIED", pod)
        for uid in set(self._known) - seen:
            self._gone(uid)
        return str(pods.metadata.resource_version)

    def _apply(self, kind: str, pod: Any) -> None:
        tenant = None if kind == "DELETED" else pod_tenant(pod)
        if tenant is None:
            self._gone(pod.metadata.uid)
            return
        self._known[pod.metadata.uid] = tenant.tenant_id
        self._loop.call_soon_threadsafe(self._upsert, tenant)

    def _gone(self, uid: str) -> None:
        tenant_id = self._known.pop(uid, None)
        if tenant_id is not None:
            self._loop.call_soon_threadsafe(self._remove, tenant_id)
