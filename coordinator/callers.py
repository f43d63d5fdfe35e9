"""Who calls the coordinator's llm-d API: the namespace of the pod behind the caller's address.

llm-d's client sends nothing but its job and group ids (plaintext gRPC, no credentials), so the
only proof of who calls is where the call comes from: the pod whose `status.podIP` is the
connection's source address, found through the API server. A pod in deletion (its
`deletionTimestamp` set) or finished vouches for no address: its containers may have stopped and
its IP gone to another pod before its kubelet says so. One call is the exception: a Yield (a pod
giving its job's turn back in its grace period, as a SIGTERM handler does) from an address that no
live pod has and one pod in deletion has is that pod's. A Yield gives a turn back and takes
nothing; without it the job would keep its turn, every other job waiting, until the pod is gone.
A job pod's address is remembered (`TTL_S` at most) until the
coordinator's watches of job pods see that pod deleted, in deletion or finished, or another job
pod at its address, or relist; another pod's address is asked for on every call, as
nothing tells when it goes: a pod's IP is handed to the next pod as soon as it is free (an
address no pod has, or several share, is remembered `TTL_S` as naming nobody). A pod
IP is assigned by the cluster's network and cannot be taken by another pod without privileges a
tenant pod does not get; an address no pod has, or that several share (host network),
identifies nobody. Baton's own client is identified by its node agent instead
(SO_PEERCRED), which vouches for the namespace with the coordination token.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from baton.contract.kube import api_error_reason
from baton.contract.names import LABEL_JOB, LABEL_LLMD_JOB

log = logging.getLogger(__name__)
TTL_S = 30.0
"""How long an address's pod is remembered at most (should a watch miss its end)."""
LEAVING_TTL_S = 2.0
"""How long a pod in deletion found at an address stands for the Yields from it before it is
asked for again (its address may go to another pod before that pod's status says so)."""
MAX_KNOWN = 4096
"""Addresses remembered at most (the oldest go first)."""
_FINISHED = ("Succeeded", "Failed")
_WATCHED = (LABEL_JOB, LABEL_LLMD_JOB)
"""The labels whose pods the coordinator watches (`coordinator.daemon`)."""


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


class _Known(NamedTuple):
    at: float
    namespace: str | None
    uid: str
    """The pod's, or "" for an address that identifies nobody."""
    leaving: str | None = None
    """For an address no live pod has: the namespace of the one pod in deletion there (a
    Yield's caller, `LEAVING_TTL_S`), if any."""


class PodCallers:
    """Maps a caller's address to its pod's namespace through the API server; `saw` and
    `relisted` (from the job pods' watches, on their threads) forget what they make stale."""

    def __init__(self, api_client: Any, clock: Callable[[], float] = time.monotonic) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._clock = clock
        self._lock = threading.Lock()
        self._known: dict[str, _Known] = {}
        self._ends = 0
        """Counts what the watches saw end (a lookup that overlaps one is not remembered)."""
        self._asking: dict[str, int] = {}
        """address → lookups of it in flight"""

    async def namespace(self, peer: str, ending: bool = False) -> str | None:
        """The namespace of the one pod at the peer's address, or None (said in the log);
        `CallerUnknown` while the API server cannot be asked (a pod is not taken for nobody).
        `ending`: the call gives a turn back, and the one pod in deletion at an address no
        live pod has makes it (for `LEAVING_TTL_S` after it was found there)."""
        ip = peer_ip(peer)
        if not ip:
            return None
        with self._lock:
            cached = self._known.get(ip)
            age = TTL_S if cached is None else self._clock() - cached.at
            if cached is not None and age < TTL_S:
                if not ending or cached.namespace is not None or cached.leaving is None:
                    return cached.namespace
                if age < LEAVING_TTL_S:
                    return cached.leaving
            ends = self._ends
            self._asking[ip] = self._asking.get(ip, 0) + 1
        try:
            known, watched = await asyncio.to_thread(self._lookup, ip)
        finally:
            with self._lock:
                self._asking[ip] -= 1
                if not self._asking[ip]:
                    del self._asking[ip]
        with self._lock:  # an API server that failed is asked again
            if ends == self._ends and (watched or known.namespace is None):
                self._remember(ip, known._replace(at=self._clock()))
            elif ends == self._ends:  # a pod there now: what was remembered of it is stale
                self._known.pop(ip, None)
        if ending and known.namespace is None and known.leaving is not None:
            log.info("a turn given back from %s: its pod, in deletion, is its caller", ip)
            return known.leaving
        return known.namespace

    def saw(self, pod: Mapping[str, Any], gone: bool) -> None:
        """A job pod as its watch saw it (`gone`: deleted, or no longer labelled)."""
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        uid, ip = str(meta.get("uid", "")), str(status.get("podIP") or "")
        ended = gone or status.get("phase") in _FINISHED or bool(meta.get("deletionTimestamp"))
        with self._lock:
            if ended or ip in self._asking:
                self._ends += 1
            for at, known in list(self._known.items()):
                same = known.uid == uid
                if (same and (ended or at != ip)) or (at == ip and not same):
                    del self._known[at]

    def relisted(self) -> None:
        """A job pods' watch listed again: pods may have gone unseen."""
        with self._lock:
            self._ends += 1
            self._known.clear()

    def _remember(self, ip: str, known: _Known) -> None:
        self._known.pop(ip, None)
        while len(self._known) >= MAX_KNOWN:
            del self._known[next(iter(self._known))]
        self._known[ip] = known

    def _lookup(self, ip: str) -> tuple[_Known, bool]:
        """The namespace of the one live pod at `ip` (or None), its uid, and, with no live pod
        there, the namespace of the one in deletion (`_Known.leaving`); and whether a job pods'
        watch will see it end (and so whether it may be remembered)."""
        try:
            pods = self._core.list_pod_for_all_namespaces(
                field_selector=f"status.podIP={ip}", _request_timeout=5
            ).items
        except Exception as err:  # the API server is down: nobody is identified meanwhile
            why = f"cannot tell who calls from {ip} ({api_error_reason(err)})"
            log.warning("%s", why)
            raise CallerUnknown(f"{why}; try again") from None
        # A finished pod keeps its podIP in its status after the network gave the IP to another
        # pod: it calls no one, and must neither hide nor stand for the pod there now. Nor does
        # a pod in deletion: its containers may have stopped and its IP gone to another pod
        # before its kubelet says so.
        running = [
            p
            for p in pods
            if not (p.spec and p.spec.host_network)
            and not (p.status and p.status.phase in _FINISHED)
        ]
        live = [p for p in running if not (p.metadata and p.metadata.deletion_timestamp)]
        leaving = running[0].metadata if not live and len(running) == 1 else None
        if len(live) != 1:
            log.info("a call from %s matches %d pods: its caller is not identified", ip, len(live))
            return _Known(0.0, None, "", str(leaving.namespace) if leaving else None), False
        meta = live[0].metadata
        if meta is None:
            return _Known(0.0, None, ""), False
        labels = meta.labels or {}
        watched = any(label in labels for label in _WATCHED)
        return _Known(0.0, str(meta.namespace), str(meta.uid or "")), watched
