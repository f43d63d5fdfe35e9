"""Tenants from the pods on this node: a watch on the API server (field selector on the node).

`pod_tenant` is pure (a pod object in, a `Tenant` or None out); `PodWatcher` runs list+watch in
a thread and hands each change to the event loop.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from agent.node.tenants import POD, Tenant
from baton.contract import names
from baton.contract.annotations import pod_assignment
from baton.contract.kube import Outage, interrupt, watch_events
from baton.contract.podask import RequestError, TenantRequest, parse_pod_request

log = logging.getLogger(__name__)

_DONE_PHASES = ("Succeeded", "Failed")
REQUEST_TIMEOUT_S = 10.0
"""A list's answer, and a connection to the API server, must come within this."""
WATCH_TIMEOUT_S = 300


def pod_tenant(pod: Mapping[str, Any]) -> Tenant | None:
    """The tenant a pod (the API server's JSON) is, or None if it has no Baton GPUs assigned
    (or has finished).

    Its GPUs are what the kubelet allocated to its containers once the device plugin has
    recorded that (`baton.dev/container-gpus`), until then the extender's proposal.
    """
    meta, status = pod.get("metadata") or {}, pod.get("status")
    assignment = pod_assignment(meta.get("annotations") or {})
    per_container = dict(assignment.container_gpus)
    allocated = {g for each in per_container.values() for g in each}
    gpus = tuple(sorted(allocated or set(assignment.assigned_gpus)))
    if not gpus or (status or {}).get("phase") in _DONE_PHASES:
        return None
    request = _request(pod) or TenantRequest(len(gpus))
    labels = meta.get("labels") or {}
    return Tenant(
        tenant_id=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        name=meta.get("name", ""),
        gpus=gpus,
        gpu_memory_mib=request.memory_mib or 0,
        gpu_duty=int(request.duty or 0) or 100,
        memory_limit_bytes=request.memory_limit_bytes or 0,
        source=POD,
        pod_uid=meta.get("uid", ""),
        labels={k: v for k, v in labels.items() if k.startswith(names.LABEL_PREFIX_LLMD)},
        container_gpus=per_container,
        containers=_container_ids(status or {}),
    )


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


class WatchError(Exception):
    """The API server ended the watch with an error other than 410 Gone (backed off)."""


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
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        from kubernetes import client

        # A client of its own that does not retry: urllib3's retries would stretch a request
        # to an unresponsive API server past what `stop` waits for (the loop backs off itself).
        configuration = copy.copy(api_client.configuration)
        configuration.retries = False
        self._api = client.ApiClient(configuration)
        self._core = client.CoreV1Api(self._api)
        self._timeout_s = request_timeout_s
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
        self._response: Any = None
        """The list or watch response being read, for `stop` to interrupt."""
        self._thread = threading.Thread(target=self._run, name="podwatch", daemon=True)

    def start(self) -> None:
        """Begin listing and watching in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop watching and wait for the thread (at most its request timeout).

        The thread must be gone before the interpreter exits: a daemon thread that wakes from
        its socket read while the interpreter finalizes aborts the whole process (SIGABRT).
        """
        self._stop.set()
        interrupt(self._response)
        if self._thread.is_alive():
            self._thread.join(self._timeout_s + 1.0)
        if self._thread.is_alive():
            log.warning("the pod watch did not stop within %.0f s", self._timeout_s + 1.0)
        else:
            self._api.close()

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        delay = 0.5
        while not self._stop.is_set():
            try:
                version = self._relist()
                self._outage.answered()
                while version and not self._stop.is_set():
                    version = self._watch(version)
                delay = 0.5
            except ApiException as exc:
                if exc.status == 410:
                    continue  # the watch's version is too old: relist at once
                self._fail(exc, delay)
                delay = min(30.0, delay * 2)
            except Exception as exc:  # connection errors of any kind: back off and relist
                self._fail(exc, delay)
                delay = min(30.0, delay * 2)

    def _fail(self, exc: Exception, delay: float) -> None:
        if not self._stop.is_set():
            self._outage.failed(exc, delay)
            self._stop.wait(delay)

    def _call(self, **kwargs: Any) -> Any:
        """A raw list or watch response of this node's pods, kept for `stop` to interrupt."""
        response = self._core.list_pod_for_all_namespaces(
            field_selector=self._selector, _preload_content=False, **kwargs
        )
        self._response = response
        if self._stop.is_set():  # stopped while the call was being made
            interrupt(response)
        return response

    def _relist(self) -> str:
        response = self._call(_request_timeout=self._timeout_s)
        try:
            pods = json.loads(response.data)
        finally:
            self._response = None
        seen = set()
        for pod in pods.get("items") or []:
            seen.add((pod.get("metadata") or {}).get("uid", ""))
            self._apply("MODIFIED", pod)
        for uid in set(self._known) - seen:
            self._gone(uid)
        return str((pods.get("metadata") or {}).get("resourceVersion", ""))

    def _watch(self, version: str) -> str:
        """Apply watch events from `version`; the version to resume from, or "" to relist."""
        response = self._call(
            resource_version=version,
            watch=True,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_S,
            _request_timeout=(self._timeout_s, WATCH_TIMEOUT_S + 30),
        )
        try:
            for event in watch_events(response):
                kind, pod = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if pod.get("code") == 410:  # the version is too old: relist at once
                        return ""
                    code, message = pod.get("code"), pod.get("message")
                    raise WatchError(f"the watch ended with {code}: {message}")
                version = str((pod.get("metadata") or {}).get("resourceVersion") or version)
                if kind != "BOOKMARK":
                    self._apply(str(kind), pod)
        finally:
            self._response = None
            response.release_conn()
        return version

    def _apply(self, kind: str, pod: Mapping[str, Any]) -> None:
        uid = (pod.get("metadata") or {}).get("uid", "")
        tenant = None if kind == "DELETED" else pod_tenant(pod)
        if tenant is None:
            self._gone(uid)
            return
        self._known[uid] = tenant.tenant_id
        self._loop.call_soon_threadsafe(self._upsert, tenant)

    def _gone(self, uid: str) -> None:
        tenant_id = self._known.pop(uid, None)
        if tenant_id is not None:
            self._loop.call_soon_threadsafe(self._remove, tenant_id)
