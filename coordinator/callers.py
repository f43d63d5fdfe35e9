"""Who calls the coordinator's llm-d API: the namespace of the pod behind the caller's address.

llm-d's client sends nothing but its job and group ids (plaintext gRPC, no credentials), so the
only proof of who calls is where the call comes from: the pod whose `status.podIP` is the
connection's source address, found through the API server (one list per new address, kept
`TTL_S`). A pod IP is assigned by the cluster's network and cannot be taken by another pod
without privileges a tenant pod does not get; an address no pod has, or that several share (host
network), identifies nobody. Baton's own client is identified by its node agent instead
(SO_PEERCRED), which vouches for the namespace with the coordination token.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from baton.contract.kube import api_error_reason

log = logging.getLogger(__name__)
TTL_S = 30.0
"""How long an address's pod is remembered (pods come and go; their IPs are reused)."""
_FINISHED = ("Succeeded", "Failed")


def peer_ip(peer: str) -> str:
    """The IP of a gRPC peer string (`ipv4:10.0.0.5:4431`, `ipv6:[::1]:4431`), or ""."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return ""


class CallerUnknown(Exception):
    """The API server could not be asked who calls (UNAVAILABLE: the call may be retried)."""


class PodCallers:
    """Maps a caller's address to its pod's namespace through the API server."""

    def __init__(self, api_client: Any, clock: Callable[[], float] = time.monotonic) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._clock = clock
        self._known: dict[str, tuple[float, str | None]] = {}

    async def namespace(self, peer: str) -> str | None:
        """The namespace of the one pod at the peer's address, or None (said in the log);
        `CallerUnknown` while the API server cannot be asked (a pod is not taken for nobody)."""
        ip = peer_ip(peer)
        if not ip:
            return None
        cached = self._known.get(ip)
        if cached is not None and self._clock() - cached[0] < TTL_S:
            return cached[1]
        found = await asyncio.to_thread(self._lookup, ip)
        self._known[ip] = (self._clock(), found)  # an API server that failed is asked again
        return found

    def _lookup(self, ip: str) -> str | None:
        try:
            pods = self._core.list_pod_for_all_namespaces(
                field_selector=f"status.podIP={ip}", _request_timeout=5
            ).items
        except Exception as err:  # the API server is down: nobody is identified meanwhile
            why = f"cannot tell who calls from {ip} ({api_error_reason(err)})"
            log.warning("%s", why)
            raise CallerUnknown(f"{why}; try again") from None
        # A finished pod keeps its podIP in its status after the network gave the IP to another
        # pod: it calls no one, and must neither hide nor stand for the pod there now.
        live = [
            p
            for p in pods
            if not (p.spec and p.spec.host_network)
            and not (p.status and p.status.phase in _FINISHED)
        ]
        if len(live) != 1:
            log.info("a call from %s matches %d pods: its caller is not identified", ip, len(live))
            return None
        meta = live[0].metadata
        return str(meta.namespace) if meta is not None else None
