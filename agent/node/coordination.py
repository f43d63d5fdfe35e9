"""Where the coordinator reaches this node's agent: the node's `baton.dev/agent-coordination`
annotation, written at start and again whenever someone else changed it (checked each minute)."""

from __future__ import annotations

import logging
from typing import Any

from baton.contract.kube import Outage
from baton.contract.names import ANNOTATION_AGENT_COORDINATION
from nodegpu.republish import Republisher

log = logging.getLogger(__name__)
RESYNC_S = 60.0


class CoordinationAddress:
    """Keeps `address` (HOST:PORT) in the node's annotation; `start`, then `stop`."""

    def __init__(self, api_client: Any, node_name: str, address: str) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self.node_name = node_name
        self.address = address
        outage = Outage(
            log,
            f"annotating node {node_name} with its agent's coordination address",
            "the coordinator cannot reach this node's agent for job turns",
        )
        self.republisher = Republisher(
            "coordination-address", self._publish, outage, 0.2, resync_s=RESYNC_S
        )

    def start(self) -> None:
        """Publish now, and again after a resync finds it changed."""
        self.republisher.start()

    def stop(self) -> None:
        """Stop publishing; the annotation stays for the next agent."""
        self.republisher.stop()

    def _publish(self) -> None:
        node = self._core.read_node(self.node_name, _request_timeout=5)
        current = ((node.metadata and node.metadata.annotations) or {}).get(
            ANNOTATION_AGENT_COORDINATION
        )
        if current == self.address:
            return
        body = {"metadata": {"annotations": {ANNOTATION_AGENT_COORDINATION: self.address}}}
        self._core.patch_node(self.node_name, body, _request_timeout=5)
        log.info("node %s: coordination address %s", self.node_name, self.address)
