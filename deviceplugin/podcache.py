"""A watch-fed cache of the pods on this node, and the pod annotation writes."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from baton.contract.annotations import decode_timestamp, pod_assignment
from baton.contract.kube import Outage
from baton.contract.podask import RequestError, read_pod_ask
from baton.contract.reflector import KubeSource, Reflector, WatchEvent
from deviceplugin.devices import PodView
from deviceplugin.errors import ApiUnavailableError, ConflictError, DevicePluginError

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 5.0
_TOMBSTONES = 1024
"""Deleted pods remembered (UID → the version of their deletion) so that an older list does not
bring them back."""


def _slot_asks(obj: Mapping[str, Any]) -> tuple[int, tuple[int, ...]]:
    """The pod's `baton.dev/gpu` as the kubelet counts it, and each GPU container's ask
    (`baton.contract.podask`); none for a pod whose ask cannot be read."""
    try:
        ask = read_pod_ask(obj)
    except RequestError as err:
        meta = obj.get("metadata") or {}
        log.debug("pod %s/%s: %s", meta.get("namespace"), meta.get("name"), err)
        return 0, ()
    return ask.slots, ask.slot_asks


def pod_view(obj: Mapping[str, Any]) -> PodView:
    """The device plugin's view of a pod object (as the API server's JSON)."""
    meta = obj.get("metadata") or {}
    assignment = pod_assignment(meta.get("annotations") or {})
    request, asks = _slot_asks(obj)
    return PodView(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        resource_version=str(meta.get("resourceVersion", "")),
        phase=(obj.get("status") or {}).get("phase") or "",
        gpu_request=request,
        assigned_gpus=assignment.assigned_gpus,
        assigned_at_ns=assignment.assigned_at_ns,
        allocated=assignment.allocated,
        created_ns=decode_timestamp(meta.get("creationTimestamp")) or 0,
        deleting=bool(meta.get("deletionTimestamp")),
        slot_asks=asks,
        container_gpus=assignment.container_gpus,
    )


def _newer(candidate: str, current: str) -> bool:
    """Whether resourceVersion `candidate` is not older than `current` (numeric when both are)."""
    if candidate.isdigit() and current.isdigit():
        return int(candidate) >= int(current)
    return True


class PodCache:
    """This node's pods, kept current by a watch; reads never call the API server."""

    def __init__(self, api_client: Any, node_name: str) -> None:
        from kubernetes import client

        self.node_name = node_name
        self._core = client.CoreV1Api(api_client)
        self._host = api_client.configuration.host
        self._pods: dict[str, PodView] = {}
        self._deleted: dict[str, str] = {}
        """Pod UID → the resourceVersion its deletion was seen at (`_TOMBSTONES` at most)."""
        self._lock = threading.Condition()
        self._synced = threading.Event()
        self._also_synced: list[threading.Event] = []
        outage = Outage(
            log,
            f"pod watch of node {node_name}",
            "Allocate still answers (it needs no pods), GetPreferredAllocation steers by the pods"
            " seen last, and their GPU annotations are corrected once it answers",
        )
        source = KubeSource(api_client, "pods", field_selector=f"spec.nodeName={node_name}")
        self._reflector = Reflector(
            source, self, outage, name="pod-watch", request_timeout_s=REQUEST_TIMEOUT_S
        )

    def start(self) -> None:
        """Start listing and watching in the background."""
        self._reflector.start()

    def stop(self) -> None:
        """Stop the watch and wait (bounded) for its thread."""
        self._reflector.stop()

    def wait_synced(self, timeout: float) -> bool:
        """Whether the first list completed within `timeout` seconds."""
        return self._synced.wait(timeout)

    def also_wake(self, event: threading.Event) -> None:
        """Set `event` too once the first list completed (at once if it has): for a wait that
        something else may end first (a stop signal)."""
        self._also_synced.append(event)
        if self._synced.is_set():
            event.set()

    def pods(self) -> list[PodView]:
        """The cached pods (no API call)."""
        with self._lock:
            return list(self._pods.values())

    def wait_for(self, accept: Callable[[list[PodView]], bool], timeout: float) -> bool:
        """Block until the cached pods satisfy `accept` (True) or `timeout` passes (False)."""
        with self._lock:
            return self._lock.wait_for(lambda: accept(list(self._pods.values())), timeout)

    def relist(self) -> list[PodView]:
        """One list replacing the cache (the fallback on a cache miss)."""
        try:
            self._reflector.list_now()
        except (ValueError, DevicePluginError):
            raise
        except Exception as err:
            raise self._failure(f"list the pods of node {self.node_name}", err) from err
        return self.pods()

    def replace(self, objects: list[dict[str, Any]], resource_version: str) -> None:
        """A full list (at `resource_version`) replaces the cache, except what the cache saw
        after it (a relist from another thread races the watch and `annotate`): a pod changed,
        added or deleted since stays as the cache has it."""
        listed = {view.uid: view for view in map(pod_view, objects)}
        with self._lock:
            pods = {}
            for uid, view in listed.items():
                current = self._pods.get(uid)
                gone = self._deleted.get(uid)
                if gone is not None and not _newer(resource_version, gone):
                    continue  # deleted after this list was taken
                if current is not None and not _newer(
                    view.resource_version, current.resource_version
                ):
                    view = current  # changed after this list was taken
                pods[uid] = view
            for uid, current in self._pods.items():
                if uid not in listed and not _newer(resource_version, current.resource_version):
                    pods[uid] = current  # added after this list was taken
            self._deleted = {
                uid: version
                for uid, version in self._deleted.items()
                if not _newer(resource_version, version)
            }
            self._pods = pods
            self._lock.notify_all()
        self._synced.set()
        for event in list(self._also_synced):
            event.set()

    def apply(self, event: WatchEvent) -> None:
        """One change the watch saw."""
        if event.type != "DELETED":
            self._store(pod_view(event.object))
            return
        meta = event.object.get("metadata") or {}
        with self._lock:
            uid = meta.get("uid", "")
            self._pods.pop(uid, None)
            self._deleted[uid] = str(meta.get("resourceVersion", ""))
            while len(self._deleted) > _TOMBSTONES:
                del self._deleted[next(iter(self._deleted))]
            self._lock.notify_all()

    def annotate(
        self, pod: PodView, annotations: Mapping[str, str], *, check_version: bool = False
    ) -> PodView:
        """Merge annotations into the pod; with `check_version`, only if it is unchanged."""
        metadata: dict[str, Any] = {"annotations": dict(annotations)}
        if check_version:
            metadata["resourceVersion"] = pod.resource_version
        raw = self._call(
            f"annotate pod {pod.key}",
            self._core.patch_namespaced_pod,
            pod.name,
            pod.namespace,
            {"metadata": metadata},
        )
        updated = pod_view(raw)
        self._store(updated)
        return updated

    def _call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            response = method(
                *args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S, **kwargs
            )
            return json.loads(response.data)
        except ValueError:
            raise
        except Exception as err:
            raise self._failure(what, err) from err

    def _failure(self, what: str, err: Exception) -> Exception:
        """The device plugin's error for a failed API call (others pass as they are)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        if isinstance(err, ApiException):
            if err.status == 409:
                return ConflictError(f"cannot {what}: it changed meanwhile ({err.reason})")
            if err.status in (429, 500, 502, 503, 504):
                return ApiUnavailableError(
                    f"cannot {what}: the Kubernetes API server at {self._host} answered "
                    f"{err.status} {err.reason}"
                )
            return DevicePluginError(
                f"cannot {what}: the API server answered {err.status} {err.reason}"
            )
        if isinstance(err, (HTTPError, OSError)):
            return ApiUnavailableError(
                f"cannot {what}: the Kubernetes API server at {self._host} is unreachable "
                f"({_root_cause(err)})"
            )
        return err

    def _store(self, pod: PodView) -> None:
        with self._lock:
            current = self._pods.get(pod.uid)
            if current is None or _newer(pod.resource_version, current.resource_version):
                self._pods[pod.uid] = pod
                self._lock.notify_all()


def _root_cause(err: BaseException) -> str:
    """The innermost reason behind urllib3's nested errors, e.g. `Connection refused`."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror
        reason = getattr(seen, "reason", None)
        seen = reason if isinstance(reason, BaseException) else (seen.__cause__ or seen.__context__)
    return f"{type(err).__name__}: {err}"
