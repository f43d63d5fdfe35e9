"""The bind verb: choose GPUs, annotate the pod under a resourceVersion precondition, bind it.

The choice is recorded as an assumption in the cluster state under the cache lock before any
API call, so a second bind right behind this one sees the slot taken. A refused bind drops it;
one sent with no answer keeps it (the pod may be bound) until the watch shows the pod or the
assumption expires.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from baton.contract.annotations import assignment_annotations
from baton.contract.names import SCHEDULER_NAME
from baton.contract.podask import RequestError, TenantRequest
from extender.cache import ClusterCache
from extender.errors import ApiConflict, ApiFailure, ApiUnsure
from extender.inventory import Assignment, pod_uid
from extender.placement import PlacedPod, place
from extender.wire import BindingArgs

BINDS_IN_FLIGHT = 8
"""Binds running at once; the others wait their turn, in arrival order.

kube-scheduler waits for filter and prioritize on its scheduling path but binds asynchronously,
and many at once. A bind's one API call waits on the API server and etcd for milliseconds, so
with too few in flight the binds fall behind the scheduling cycle. Binds run on the event loop
(`extender.apipost`), so those in flight cost the verbs nothing while they wait.
"""
NOT_SYNCED = "the extender's cluster cache has not synced with the API server yet; retry shortly"


class PodApi(Protocol):
    """The API calls a bind needs (the read only when the cache lacks the pod)."""

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """The pod as the API server has it now."""
        ...

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        resource_version: str = "",
        annotations: dict[str, str] | None = None,
    ) -> None:
        """Create the pod's Binding to the node, writing `annotations` on the pod with it.

        With `resource_version`, the API server binds only a pod still at that version
        (else `ApiConflict`): the GPU assignment and the node are one atomic write.
        """
        ...

    def close(self) -> None:
        """Close what it keeps open for the running event loop (its kept-alive connections)."""
        ...


class Binder:
    """Binds pods to nodes with GPUs chosen by the placement policy."""

    def __init__(self, cache: ClusterCache, api: PodApi, clock_ns: Callable[[], int]):
        self._cache = cache
        self._state = cache.state
        self._api = api
        self._clock_ns = clock_ns

    def close(self) -> None:
        """Close the API connections kept for the running event loop (call it on that loop)."""
        self._api.close()

    async def bind(self, args: BindingArgs) -> str:
        """Bind the pod; the empty string on success, else why it did not."""
        where = f"pod {args.pod_namespace}/{args.pod_name}"
        for attempt in (1, 2):
            try:
                await self._attempt(args, cached=attempt == 1)
                return ""
            except ApiConflict as err:
                if attempt == 2:
                    return f"binding {where} to {args.node}: conflict twice in a row: {err}"
            except (ApiFailure, _Refused) as err:
                return f"binding {where} to {args.node}: {err}"
        raise AssertionError("unreachable")

    async def _attempt(self, args: BindingArgs, cached: bool) -> None:
        """One try: the pod as the watch showed it (first) or as the API server has it now.

        A stale cached pod costs nothing but the retry: the Binding's resourceVersion
        precondition makes the API server refuse it with a conflict.
        """
        if self._state.dra:  # its profile has no bindVerb: nobody kube-scheduler sent asks
            raise _Refused(
                "on the DRA path (--dra) kube-scheduler binds pods itself; this extender binds none"
            )
        pod = self._pod(args) if cached else None
        if pod is None:
            pod = await self._api.get_pod(args.pod_namespace, args.pod_name)
        uid = pod_uid(pod)
        if args.pod_uid and uid != args.pod_uid:
            raise _Refused(f"the pod now has UID {uid}, not {args.pod_uid}")
        spec = pod.get("spec") or {}
        scheduler = spec.get("schedulerName") or "default-scheduler"  # the API server's default
        if scheduler != SCHEDULER_NAME:
            # kube-scheduler's baton-scheduler profile sends only its own pods; anyone else who
            # reaches the port must not bind, with this extender's rights, a pod it does not place.
            raise _Refused(
                f"its schedulerName is {scheduler}, not {SCHEDULER_NAME}, the profile this "
                "extender binds for"
            )
        bound = spec.get("nodeName")
        if bound:
            raise _Refused(f"it is already bound to node {bound}")
        try:
            request = self._state.request(pod)
        except RequestError as err:
            raise _Refused(str(err)) from None
        if request is None:
            await self._api.bind_pod(args.pod_namespace, args.pod_name, uid, args.node)
            return
        chosen = self._assume(args, uid, request)
        try:
            version = str((pod.get("metadata") or {}).get("resourceVersion", ""))
            notes = assignment_annotations(chosen.gpus, self._clock_ns())
            await self._api.bind_pod(
                args.pod_namespace, args.pod_name, uid, args.node, version, notes
            )
        except ApiUnsure:
            # The API server may have bound it: the slot stays assumed, past a retry of this
            # pod too, until the watch shows the pod bound or gone or the assumption expires.
            with self._cache.changed:
                self._state.keep_unsure(uid)
                self._cache.changed.notify_all()
            raise
        except BaseException:
            with self._cache.changed:
                self._state.forget(uid)
                self._cache.changed.notify_all()
            raise

    def _pod(self, args: BindingArgs) -> dict[str, Any] | None:
        if not args.pod_uid:
            return None
        with self._cache.changed:
            pod = self._state.pending_pod(args.pod_uid)
        meta = (pod or {}).get("metadata") or {}
        if meta.get("name") != args.pod_name or meta.get("namespace") != args.pod_namespace:
            return None
        return pod

    def _assume(self, args: BindingArgs, uid: str, request: TenantRequest) -> Assignment:
        if not self._cache.synced():  # before the pods are listed, every GPU looks empty
            raise _Refused(NOT_SYNCED)
        with self._cache.changed:
            sent = self._state.assumption(uid)
            if sent is not None:
                # Another bind of the pod is in flight or went through (kube-scheduler sent it
                # again after a timeout): its slot stays counted until the watch settles it.
                raise _Refused(f"a bind of it was sent already, to node {sent.node}")
            node = self._state.node(args.node)
            if node is None:
                raise _Refused("the extender's cache does not know that node")
            verdict = place(node, request, self._state.limits)
            if not verdict.fits:
                raise _Refused(f"it no longer fits: {verdict.reason}")
            tenant = PlacedPod(uid, request.memory_mib, request.duty)
            pod = f"{args.pod_namespace}/{args.pod_name}"
            chosen = Assignment(uid, pod, args.node, verdict.gpus, tenant)
            self._state.assume(chosen)
            self._cache.changed.notify_all()
        return chosen


class _Refused(Exception):
    """The bind cannot go ahead for a reason of the pod or node, not the API server."""
