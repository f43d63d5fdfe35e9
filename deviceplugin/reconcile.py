"""Reconciling pod annotations from the kubelet's allocation (its PodResources API).

After every Allocate (the kubelet records it once Allocate returns, so a few passes in quick
succession), and every `interval_s` anyway, the reconciler lists what the kubelet allocated to
each container and corrects the pods whose annotations say otherwise (`truth.py`): the kubelet
wins, and the extender's cache and the agent read the corrected annotations.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from baton.contract import names
from baton.contract.annotations import encode_timestamp
from deviceplugin.allocation import PodSource
from deviceplugin.devices import PodView
from deviceplugin.errors import DevicePluginError
from deviceplugin.truth import Reconciliation, container_gpus, reconcile
from nodegpu.metrics import Metrics

if TYPE_CHECKING:
    from deviceplugin.podresources import Allocations, PodKey

log = logging.getLogger(__name__)
AFTER_ALLOCATE_S = (0.02, 0.1, 0.5, 2.0)
"""Delays of the passes after an Allocate: the kubelet records it only once Allocate returns."""
DEFAULT_INTERVAL_S = 10.0


class AllocationLister(Protocol):
    """The kubelet's per-container allocations (`PodResourcesClient`)."""

    def list(self) -> Allocations:
        """Pod → container → device IDs."""


class Reconciler:
    """Keeps every pod's GPU annotations equal to what the kubelet allocated."""

    def __init__(
        self,
        lister: AllocationLister,
        source: PodSource,
        metrics: Metrics,
        node_name: str,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.lister = lister
        self.source = source
        self.metrics = metrics
        self.node_name = node_name
        self.interval_s = interval_s
        self.clock_ns = clock_ns
        self.passes = 0
        self._started = 0
        self._problem = ""
        self._absent: set[PodKey] = set()
        """Pods the kubelet lists that the last list did not find (gone): not listed for again."""
        self._due: list[float] = []
        self._wake = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="reconcile", daemon=True)

    def start(self) -> None:
        """Reconcile now, after every poke, and every `interval_s`."""
        self.poke()
        self._thread.start()

    def stop(self) -> None:
        """Stop reconciling."""
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def poke(self) -> None:
        """An Allocate happened: reconcile in a moment (and again shortly after)."""
        now = time.monotonic()
        with self._wake:
            for delay in AFTER_ALLOCATE_S:
                due = now + delay
                if not any(abs(due - other) < delay / 4 for other in self._due):
                    self._due.append(due)
            self._due.sort()
            self._wake.notify_all()

    def settle(self, timeout: float) -> bool:
        """Run a pass now and wait until one that began after this call has finished."""
        with self._wake:
            target = self._started + 1
        self.poke()
        with self._wake:
            return self._wake.wait_for(lambda: self.passes >= target or self._stop, timeout)

    def _run(self) -> None:
        last = time.monotonic()
        while True:
            with self._wake:
                while not self._stop:
                    now = time.monotonic()
                    due = min(self._due[0] if self._due else now + 1e9, last + self.interval_s)
                    if due <= now:
                        break
                    self._wake.wait(due - now)
                if self._stop:
                    return
                self._due = [d for d in self._due if d > now]
                self._started += 1
            try:
                self.reconcile_once()
                if self._problem:
                    log.info("reconciling GPU annotations on node %s again", self.node_name)
                self._problem = ""
            except DevicePluginError as err:
                if str(err) != self._problem:  # once per distinct problem, not every pass
                    log.warning("cannot reconcile GPU annotations on %s: %s", self.node_name, err)
                self._problem = str(err)
            except Exception:
                log.exception("reconciling GPU annotations on node %s failed", self.node_name)
            last = time.monotonic()
            with self._wake:
                self.passes += 1
                self._wake.notify_all()

    def reconcile_once(self) -> list[Reconciliation]:
        """One pass: list the kubelet's allocations, correct the pods that disagree."""
        allocated = self.lister.list()
        cached = {(p.namespace, p.name): p for p in self.source.pods()}
        # One list for a pod the watch has not shown yet; not for one being deleted (the kubelet
        # lists it until its containers are gone), nor again for one a list did not find.
        if any(key not in cached and key not in self._absent for key in allocated):
            cached = {(p.namespace, p.name): p for p in self.source.relist()}
            self._absent = {key for key in allocated if key not in cached}
        pods = {key: pod for key, pod in cached.items() if not pod.deleting}
        now = encode_timestamp(self.clock_ns())
        done = []
        for key, devices in sorted(allocated.items()):
            pod = pods.get(key)
            if pod is not None:
                done.append(self._correct(pod, container_gpus(devices), now))
        return done

    def _correct(self, pod: PodView, gpus: dict[str, tuple[str, ...]], now: str) -> Reconciliation:
        result = reconcile(pod, gpus, now)
        if result.outcome == "unchanged":
            return result
        self.source.annotate(pod, result.annotations)
        self.metrics.reconciled.labels(outcome=result.outcome).inc()
        allocated = ",".join(result.allocated)
        if result.outcome == "fallback":
            self.metrics.fallbacks.inc()
            log.warning(
                "pod %s reached node %s without a GPU assignment (scheduled without the Baton "
                "extender?); the kubelet gave it GPUs %s, recorded as its %s",
                pod.key,
                self.node_name,
                allocated,
                names.ANNOTATION_ASSIGNED_GPUS,
            )
        elif result.outcome == "corrected":
            log.warning(
                "pod %s: the extender proposed GPUs %s but the kubelet allocated %s; "
                "the kubelet wins and %s now says so",
                pod.key,
                ",".join(result.proposed),
                allocated,
                names.ANNOTATION_ASSIGNED_GPUS,
            )
        else:
            log.info("pod %s: the kubelet allocated the proposed GPUs %s", pod.key, allocated)
        return result
