"""Watches of the addresses of llm-d callers that are no job pod (`coordinator.callers`).

The coordinator's own watches see only job pods, so nothing else would tell it when another
caller's pod (a dashboard polling GetGroupStatus) ends and its IP goes to the next pod. Once such a
caller is identified, its address is watched (`status.podIP=<ip>`, every namespace): from the
watch's first list on, the pod there is known without asking the API server, until the watch
sees it end or another pod there. A watch that fails forgets what it knew and lists again. At
most `MAX_WATCHED` addresses are watched (the least recently asked stop first), each until it has
not been asked for `IDLE_S`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from baton.contract.kube import Outage
from baton.contract.names import LABEL_JOB, LABEL_LLMD_JOB
from baton.contract.reflector import KubeSource, Reflector, Source, WatchEvent

log = logging.getLogger(__name__)
MAX_WATCHED = 32
"""Addresses watched at most."""
IDLE_S = 300.0
"""An address not asked for this long is no longer watched."""
_FINISHED = ("Succeeded", "Failed")
_WATCHED = (LABEL_JOB, LABEL_LLMD_JOB)
"""The labels whose pods the coordinator watches (`coordinator.daemon`)."""


class Identity(NamedTuple):
    namespace: str | None
    """The namespace of the one live pod at an address, or None (no pod, or several)."""
    uid: str
    job_pod: bool
    """Whether the coordinator's job pods' watches will see it end."""


NOBODY = Identity(None, "", False)


def identity(pods: Iterable[Mapping[str, Any]]) -> Identity:
    """Who the pods at one address (as the API server shows them) say calls from there.

    A finished pod keeps its podIP in its status after the network gave the IP to another pod:
    it calls no one, and must neither hide nor stand for the pod there now. Nor does a pod in
    deletion: its containers may have stopped and its IP gone to another pod before its kubelet
    says so. A host-network pod shares its node's address: it identifies nobody."""
    live = [
        p
        for p in pods
        if not (p.get("spec") or {}).get("hostNetwork")
        and (p.get("status") or {}).get("phase") not in _FINISHED
        and not (p.get("metadata") or {}).get("deletionTimestamp")
    ]
    if len(live) != 1:
        return NOBODY
    meta = live[0].get("metadata") or {}
    labels = meta.get("labels") or {}
    watched = any(label in labels for label in _WATCHED)
    return Identity(str(meta.get("namespace", "")), str(meta.get("uid", "")), watched)


class _Address:
    """The pods at one address as its watch shows them (`baton.contract.reflector.Store`)."""

    def __init__(self, asked: float) -> None:
        self.lock = threading.Lock()
        self.asked = asked
        self.pods: dict[str, Mapping[str, Any]] = {}
        self.known: Identity | None = None
        """Who calls from there; None until listed, and again after the watch failed."""
        self.reflector: Reflector | None = None

    def replace(self, objects: list[dict[str, Any]], resource_version: str) -> None:
        with self.lock:
            self.pods = {str((p.get("metadata") or {}).get("uid", "")): p for p in objects}
            self.known = identity(self.pods.values())

    def apply(self, event: WatchEvent) -> None:
        uid = str((event.object.get("metadata") or {}).get("uid", ""))
        with self.lock:
            if event.type == "DELETED":
                self.pods.pop(uid, None)
            else:
                self.pods[uid] = event.object
            if self.known is not None:
                self.known = identity(self.pods.values())

    def failed(self, why: str) -> None:
        """The watch failed: events may be missed until it lists again."""
        with self.lock:
            self.known = None
        if self.reflector is not None:
            self.reflector.resource_version = ""  # list again rather than resume


class AddressWatches:
    """The watched addresses: `known(ip)` answers from a watch, `watch(ip)` starts one."""

    def __init__(self, source: Callable[[str], Source], clock: Callable[[], float]) -> None:
        """`source(ip)` lists and watches the pods at `ip`."""
        self._source = source
        self._clock = clock
        self._lock = threading.Lock()
        self._addresses: dict[str, _Address] = {}

    @classmethod
    def through(cls, api_client: Any, clock: Callable[[], float]) -> AddressWatches:
        def source(ip: str) -> Source:
            return KubeSource(api_client, "pods", field_selector=f"status.podIP={ip}")

        return cls(source, clock)

    def known(self, ip: str) -> Identity | None:
        """The one live pod at `ip` as its watch shows it, or None where it does not tell (not
        watched, not listed yet, failing, or no single live pod there: a new pod's first call
        is looked up rather than refused)."""
        now = self._clock()
        with self._lock:
            address = self._addresses.get(ip)
            if address is None:
                return None
            address.asked = now
            with address.lock:
                known = address.known
        return known if known is not None and known.namespace is not None else None

    def watching(self, ip: str) -> bool:
        """Whether `ip`'s watch has listed (and not failed since)."""
        with self._lock:
            address = self._addresses.get(ip)
        return address is not None and address.known is not None

    def watch(self, ip: str) -> None:
        """Watch `ip` (if not yet), stopping the watches asked for least recently."""
        now = self._clock()
        with self._lock:
            ended = [a for a, w in self._addresses.items() if now - w.asked >= IDLE_S]
            if ip not in self._addresses:
                by_age = sorted(self._addresses, key=lambda a: self._addresses[a].asked)
                ended += by_age[: max(0, len(self._addresses) + 1 - MAX_WATCHED)]
            stopping = [self._addresses.pop(a) for a in set(ended) - {ip}]
            address = self._addresses.get(ip)
            if address is None:
                address = self._addresses[ip] = _Address(now)
                outage = Outage(log, f"watch of the pods at {ip}", "its caller is looked up")
                address.reflector = Reflector(
                    self._source(ip),
                    address,
                    outage,
                    name=f"caller-{ip}",
                    on_restart=address.failed,
                )
                address.reflector.start()
        for each in stopping:  # off the caller's path: a stop waits for its thread
            if each.reflector is not None:
                threading.Thread(target=each.reflector.stop, daemon=True).start()

    def stop(self) -> None:
        """Stop every watch (bounded)."""
        with self._lock:
            addresses, self._addresses = list(self._addresses.values()), {}
        for address in addresses:
            if address.reflector is not None:
                address.reflector.stop(5)
