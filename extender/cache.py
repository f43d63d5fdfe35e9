"""The cluster cache: `ClusterState` behind a lock, fed by a list+watch reflector per kind.

The reflectors (`baton.contract.reflector`) list, watch, relist on 410 and back off on errors;
this file only decides what each change does to the state.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from baton.contract.kube import Outage
from baton.contract.reflector import KubeSource, Reflector, WatchEvent
from extender.kubeapi import POD_FIELD_SELECTOR
from extender.state import ClusterState

log = logging.getLogger(__name__)
KINDS = ("nodes", "pods")
DRA_KINDS = (*KINDS, "resourceclaims")
"""With `--dra`: the claims whose allocations place pods on DRA nodes, too."""
SELECTORS = {"nodes": "", "pods": POD_FIELD_SELECTOR, "resourceclaims": ""}
Change = Callable[[ClusterState, Any], None]
REQUEST_TIMEOUT_S = 30.0
"""A list page of the whole cluster, and a connection to the API server, must come within this."""


class ClusterCache:
    """The state and its lock; `synced()` once every kind has been listed."""

    def __init__(self, state: ClusterState, kinds: tuple[str, ...] = KINDS):
        self.state = state
        self.kinds = kinds
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        """Notified, with the lock held, after every change the watches apply."""
        self.relisting = threading.Lock()
        """Held while a relist is rebuilt off `lock`: one at a time (`extender.relist`)."""
        self._synced = {kind: threading.Event() for kind in kinds}

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

    def watching(self) -> bool:
        """Whether the watches are up (a cache filled by hand always is)."""
        return True


class KubeCache(ClusterCache):
    """A cluster cache kept current by a reflector per kind against the API server."""

    def __init__(
        self,
        state: ClusterState,
        api_client: Any,
        on_restart: Callable[[str, str], None] = lambda kind, why: None,
        kinds: tuple[str, ...] = KINDS,
    ):
        super().__init__(state, kinds)
        outage = Outage(
            log,
            f"listing and watching {_spoken(kinds)}",
            "/readyz is not ready and filter answers from what was listed before, if anything",
        )
        self._outage = outage
        self._reflectors = [
            Reflector(
                KubeSource(api_client, kind, field_selector=SELECTORS[kind]),
                _KindStore(self, kind),
                outage,
                name=f"watch-{kind}",
                on_restart=functools.partial(on_restart, kind),
                request_timeout_s=REQUEST_TIMEOUT_S,
            )
            for kind in kinds
        ]

    def start(self) -> KubeCache:
        """Start the watch loops."""
        for reflector in self._reflectors:
            reflector.start()
        return self

    def watching(self) -> bool:
        """Whether no watch is failing now (an outage's failures are counted until one answers)."""
        return self._outage.failures == 0

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the loops and close their watches."""
        for reflector in self._reflectors:
            reflector.stop(timeout_s)


class _KindStore:
    """One kind's part of the state, as the reflector hands it: each change under the lock, a
    relist rebuilt off it (`extender.relist`), one at a time, and swapped in under it."""

    def __init__(self, cache: ClusterCache, kind: str) -> None:
        self._cache, self._kind = cache, kind
        changes: dict[str, tuple[Change, Change, Change]] = {
            "nodes": (
                ClusterState.replace_nodes,
                ClusterState.upsert_node,
                ClusterState.delete_node,
            ),
            "pods": (ClusterState.replace_pods, ClusterState.upsert_pod, ClusterState.delete_pod),
            "resourceclaims": (
                ClusterState.replace_claims,
                ClusterState.upsert_claim,
                ClusterState.delete_claim,
            ),
        }
        self._replace, self._upsert, self._delete = changes[kind]

    def replace(self, objects: list[dict[str, Any]], resource_version: str) -> None:
        cache = self._cache
        with cache.relisting:
            with cache.changed:
                fork = cache.state.fork()
            try:
                self._replace(fork, objects)
            except BaseException:
                with cache.changed:
                    cache.state.adopt(None)
                raise
            with cache.changed:
                replaced = cache.state.adopt(fork)
                cache.changed.notify_all()
            del fork, replaced  # freed here, off the lock
        cache.mark_synced(self._kind)

    def apply(self, event: WatchEvent) -> None:
        apply = self._delete if event.type == "DELETED" else self._upsert
        with self._cache.changed:
            apply(self._cache.state, event.object)
            self._cache.changed.notify_all()


def _spoken(kinds: tuple[str, ...]) -> str:
    """`nodes and pods`, `nodes, pods and resourceclaims`: the kinds as a log line says them."""
    return " and ".join([", ".join(kinds[:-1]), kinds[-1]] if len(kinds) > 1 else list(kinds))
