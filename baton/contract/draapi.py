"""The one client of the DRA API (resource.k8s.io/v1) on a node, as raw JSON.

Baton's driver's ResourceSlices on one node, ResourceClaims, and the node itself; the DRA driver
and the agent's DRA view both read through it. A missing claim is None, never an exception.
Raw JSON because the client's models lag resource.k8s.io/v1.
"""

from __future__ import annotations

import json
from typing import Any

from baton.contract import names

REQUEST_TIMEOUT_S = 10.0


class DraApi:
    """ResourceSlices of Baton's driver on one node, ResourceClaims, and the node itself."""

    def __init__(self, api_client: Any, node_name: str) -> None:
        from kubernetes import client

        # Any: the answers are raw (`_preload_content=False`), not the client's models.
        self._resource: Any = client.ResourceV1Api(api_client)
        self._core: Any = client.CoreV1Api(api_client)
        self.node_name = node_name

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The claim, or None when it is gone."""
        from kubernetes.client.exceptions import ApiException

        try:
            answer = self._resource.read_namespaced_resource_claim(
                name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return dict(json.loads(answer.data))

    def list_slices(self) -> list[dict[str, Any]]:
        """Baton's driver's slices on this node."""
        answer = self._resource.list_resource_slice(
            field_selector=f"spec.nodeName={self.node_name},spec.driver={names.DRA_DRIVER}",
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT_S,
        )
        return list(json.loads(answer.data).get("items") or [])

    def create_slice(self, body: dict[str, Any]) -> None:
        self._resource.create_resource_slice(
            body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
        )

    def replace_slice(self, name: str, body: dict[str, Any]) -> None:
        self._resource.replace_resource_slice(
            name, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
        )

    def delete_slice(self, name: str) -> None:
        self._resource.delete_resource_slice(
            name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
        )

    def node(self) -> dict[str, Any]:
        """This node's object."""
        answer = self._core.read_node(
            self.node_name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
        )
        return dict(json.loads(answer.data))
