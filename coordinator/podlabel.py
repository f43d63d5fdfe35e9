"""The leader's mark on its own pod, `baton.dev/coordinator-leader=true`, which the Service
selects: set while this replica leads, absent otherwise.

One thread keeps the label as the latest wish has it, retrying (with backoff) until the API
server takes it, so a removal still being retried cannot undo a later labelling. The wish at
start is "not leading": a replica restarted in a pod that a crashed leader had labelled removes
the mark, or the Service would keep sending calls to a standby.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from baton.contract import names
from baton.contract.kube import Outage

log = logging.getLogger(__name__)

RETRY_FIRST_S = 1.0
RETRY_MAX_S = 10.0
REQUEST_TIMEOUT_S = 5.0


class LeaderLabel:
    """`want(leading)` from any thread; `stop` when done. `patch(leading)` writes the label."""

    def __init__(self, patch: Callable[[bool], object], where: str) -> None:
        self._patch = patch
        self._outage = Outage(
            log, f"the leader label on pod {where}", "the Service may reach the wrong replica"
        )
        self._lock = threading.Lock()
        self._wanted = False
        self._applied: bool | None = None
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-label", daemon=True)

    @classmethod
    def on_pod(cls, api_client: Any, namespace: str, pod: str) -> LeaderLabel:
        """The label of `namespace/pod`, through the API server."""
        from kubernetes import client

        core = client.CoreV1Api(api_client)

        def patch(leading: bool) -> None:
            value = "true" if leading else None
            body = {"metadata": {"labels": {names.LABEL_COORDINATOR_LEADER: value}}}
            core.patch_namespaced_pod(pod, namespace, body, _request_timeout=REQUEST_TIMEOUT_S)

        return cls(patch, f"{namespace}/{pod}")

    def start(self) -> None:
        """Begin with the label removed (this replica does not lead yet)."""
        self._wake.set()
        self._thread.start()

    def want(self, leading: bool) -> None:
        """The label as it should be from now."""
        with self._lock:
            self._wanted = leading
        self._wake.set()

    def applied(self) -> bool | None:
        """What the API server last took (None before the first write)."""
        with self._lock:
            return self._applied

    def stop(self, timeout: float = REQUEST_TIMEOUT_S + 1) -> None:
        """Stop, once the label is as last wished (one more try if it is not; bounded)."""
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        delay = RETRY_FIRST_S
        while self._wake.wait():
            with self._lock:
                wanted = self._wanted
                self._wake.clear()
                if wanted == self._applied:
                    if self._stopping.is_set():
                        return
                    continue
            try:
                self._patch(wanted)
            except Exception as err:
                if self._stopping.is_set():
                    return
                self._outage.failed(err, delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                self._wake.set()
                continue
            self._outage.answered()
            delay = RETRY_FIRST_S
            with self._lock:
                self._applied = wanted
            self._wake.set()  # look again: a newer wish, or stopping
