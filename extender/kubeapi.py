"""The extender's calls to the Kubernetes API, on raw JSON, errors mapped to `ApiFailure`.

Its lists and watches go through `baton.contract.reflector` (`extender.cache`), read by orjson.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import orjson

from extender import kubeproto
from extender.apipost import ApiPost, refusal, unreachable
from extender.errors import ApiFailure

POD_FIELD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"
"""The pods the extender watches: finished ones hold no GPU."""


def api_errors(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Map the client's exceptions in the wrapped call to `ApiFailure` / `ApiConflict`."""

    def wrap(call: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return call(*args, **kwargs)
            except ApiFailure:
                raise
            except Exception as err:
                raise translate(err, what) from err

        return run

    return wrap


def translate(err: Exception, what: str) -> ApiFailure:
    """A clear `ApiFailure` for an exception raised by the Kubernetes client."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(err, ApiException):
        return refusal(what, err.status, err.body, err.reason)
    return unreachable(what, err)


class KubePodApi:
    """`PodApi` over the Kubernetes API: binds posted from the event loop (`ApiPost`), the
    rare read by the Kubernetes client in a thread."""

    def __init__(self, api_client: Any, timeout_s: float = 1.5):
        """`timeout_s` per call: a bind makes up to six, within kube-scheduler's 5 s."""
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._post = ApiPost(api_client, timeout_s)
        self._timeout = timeout_s

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """The pod as the API server has it now."""
        return await asyncio.to_thread(self._read_pod, namespace, name)

    def _read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        what = f"reading pod {namespace}/{name}"
        call = api_errors(what)(self._core.read_namespaced_pod)
        resp = call(name, namespace, _preload_content=False, _request_timeout=self._timeout)
        return dict(orjson.loads(_read(resp, what)))

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        resource_version: str = "",
        annotations: dict[str, str] | None = None,
    ) -> None:
        """Create the pod's Binding: UID and resourceVersion preconditions (409 when stale).

        The API server copies a Binding's annotations onto the pod in the same write that sets
        its node, so a pod is never seen annotated but unbound, or bound without its GPUs. The
        Binding goes in protobuf, as kube-scheduler sends it (`extender.kubeproto`).
        """
        body = kubeproto.binding(
            namespace,
            name,
            node,
            uid=uid if "/" not in uid else "",
            resource_version=resource_version,
            annotations=annotations,
        )
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/binding"
        what = f"binding pod {namespace}/{name}"
        await self._post(path, body, what, kubeproto.CONTENT_TYPE)

    def close(self) -> None:
        """Close the running loop's kept-alive connections."""
        self._post.close()


def _read(resp: Any, what: str) -> bytes:
    """The whole body of a raw (`_preload_content=False`) response.

    Reading it to the end is what hands the connection back to urllib3's pool; a response left
    unread keeps its connection out of the pool, so every call would open a new one.
    """
    try:
        return bytes(resp.data)
    except Exception as err:
        raise translate(err, what) from err
