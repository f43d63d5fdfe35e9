"""The cluster cache: `ClusterState` behind a lock, fed by list+watch of nodes and pods.

Each kind runs in its own thread: list, then watch from the list's resourceVersion; a watch the
server ends is resumed from the last version seen; any error (410 Gone, a dropped connection,
an outage) leads to a fresh list after a short, growing backoff.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from baton.contract.kube import Outage
from extender.errors import ApiFailure
from extender.kubeapi import Lister, Watch
from extender.state import ClusterState

log = logging.getLogger(__name__)
KINDS = ("nodes", "pods")
WATCH_TIMEOUT_S = 300
BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)


class ClusterCache:
    """The state and its lock; `synced()` once every kind has been listed."""

    def __init__(self, state: ClusterState):
        self.state = state
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        """Notified, with the lock held, after every change the watches apply."""
        self._synced = {kind: threading.Event() for kind in KINDS}

    @classmethod
    def filled(
        cls, state: ClusterState, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]
    ) -> ClusterCache:
        """A synced cache holding the given objects (benchmarks, tests, dry runs)."""
        cache = cls(state)
        state.replace_nodes(nodes)
        state.replace_pods(pods)
        for kind in KINDS:
            cache.mark_synced(kind)
        return cache

    def synced(self) -> bool:
        """Whether every kind has been listed at least once."""
        return all(e.is_set() for e in self._synced.values())

    def wait_synced(self, timeout_s: float) -> bool:
        """Wait (bounded) until synced."""
        return all(e.wait(timeout_s) for e in self._synced.values())

    def wait_for(self, predicate: Callable[[ClusterState], bool], timeout_s: float) -> bool:
        """Wait (bounded) until the predicate holds for the state."""
        with self.changed:
            return self.changed.wait_for(lambda: predicate(self.state), timeout_s)

    def mark_synced(self, kind: str) -> None:
        """Record that a kind has been listed (for caches filled by hand)."""
        self._synced[kind].set()


class KubeCache(ClusterCache):
    """A cluster cache kept current by watches against the API server."""

    def __init__(
        self,
        state: ClusterState,
        api_client: Any,
        on_restart: Callable[[str, str], None] = lambda kind, why: None,
    ):
        super().__init__(state)
        self._listers = {kind: Lister(api_client, kind) for kind in KINDS}
        self._on_restart = on_restart
        self._outage = Outage(
            log,
            "listing and watching nodes and pods",
            "/readyz is not ready and filter answers from what was listed before, if anything",
        )
        self._stop = threading.Event()
        self._watches: dict[str, Watch] = {}
        self._threads: list[threading.Thread] = []

    def start(self) -> KubeCache:
        """Start both watch loops."""
        for kind in KINDS:
            thread = threading.Thread(target=self._run, args=(kind,), name=f"watch-{kind}")
            thread.daemon = True
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the loops and close their watches."""
        self._stop.set()
        for watch in list(self._watches.values()):
            watch.close()
        for thread in self._threads:
            thread.join(timeout_s)

    def _run(self, kind: str) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                version = self._relist(kind)
                self._outage.answered()
                failures = 0
                while not self._stop.is_set():
                    version = self._watch(kind, version)
            except Exception as err:
                if self._stop.is_set():
                    return
                why = f"{type(err).__name__}: {err}"
                backoff = BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
                self._outage.failed(err, backoff)
                self._on_restart(kind, why)
                self._stop.wait(backoff)
                failures += 1

    def _relist(self, kind: str) -> str:
        items, version = self._listers[kind].list()
        with self.changed:
            if kind == "nodes":
                self.state.replace_nodes(items)
            else:
                self.state.replace_pods(items)
            self.changed.notify_all()
        self._synced[kind].set()
        return version

    def _watch(self, kind: str, version: str) -> str:
        watch = self._listers[kind].watch(version, WATCH_TIMEOUT_S)
        self._watches[kind] = watch
        if self._stop.is_set():
            watch.close()
        for event in watch:
            version = self._apply(kind, event) or version
        log.debug("watch of %s ended at resourceVersion %s", kind, version)
        return version

    def _apply(self, kind: str, event: dict[str, Any]) -> str:
        kind_of_event = event.get("type")
        obj = event.get("object") or {}
        if kind_of_event == "ERROR":
            code, message = obj.get("code"), obj.get("message")
            raise ApiFailure(f"watching {kind}: API server answered {code}: {message}")
        version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        if kind_of_event not in ("ADDED", "MODIFIED", "DELETED"):
            return version
        deleted = kind_of_event == "DELETED"
        apply: Callable[[dict[str, Any]], None]
        if kind == "nodes":
            apply = self.state.delete_node if deleted else self.state.upsert_node
        else:
            apply = self.state.delete_pod if deleted else self.state.upsert_pod
        with self.changed:
            apply(obj)
            self.changed.notify_all()
        return version
