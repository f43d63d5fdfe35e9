"""Leader election with a `coordination.k8s.io/v1` Lease whose `leaseTransitions` is the epoch.

`coordinator.lease` is the pure core (renew, take over or wait). `LeaderElector` is the shell: a
thread that reads and writes the Lease with optimistic concurrency, and steps down
`renew_deadline_s` after its last renewal, before the Lease expires. Its deadlines are kept on
the monotonic clock: the wall clock (what the Lease's times say) may be set back or forward.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from baton.contract.kube import Outage, api_error_reason
from coordinator.lease import (
    Action,
    Candidate,
    LeaseRecord,
    check_timing,
    decide,
    lease_object,
    lease_record,
)

__all__ = [
    "Action",
    "Candidate",
    "LeaderElector",
    "LeaseRecord",
    "check_timing",
    "decide",
    "lease_object",
    "lease_record",
]

log = logging.getLogger(__name__)

LAPSE_MARGIN_S = 0.01
"""A standby tries again this long after the holder's claim lapses (a takeover needs it past)."""


class LeaderElector:
    """Campaigns for one Lease on its own thread; leads until stopped or until it cannot renew
    for `renew_deadline_s`. Callbacks run on that thread and must return quickly.

    It calls the API server on a client of its own, made from `api_client`'s configuration
    without urllib3's retries, so that every call ends by the leader's deadline.
    """

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        name: str,
        identity: str,
        lease_duration_s: int = 15,
        renew_deadline_s: float = 10,
        retry_period_s: float = 2,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_started_leading: Callable[[int], object] | None = None,
        on_stopped_leading: Callable[[str], object] | None = None,
        annotate: Callable[[], dict[str, str]] | None = None,
    ) -> None:
        """`annotate()`, called on this thread at each renewal, gives annotations the Lease
        carries for the next leader (`inherited` holds those found when a term began). `clock`
        gives the times written in the Lease; `monotonic` measures every deadline."""
        for arg, value in (("namespace", namespace), ("name", name), ("identity", identity)):
            if not value or not isinstance(value, str):
                raise ValueError(f"{arg} must be a non-empty string, not {value!r}")
        check_timing(lease_duration_s, renew_deadline_s, retry_period_s)
        from kubernetes import client

        configuration = copy.copy(api_client.configuration)
        configuration.retries = False
        self._client = client.ApiClient(configuration)
        self._api: Any = client.CoordinationV1Api(self._client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self._clock = clock
        self._monotonic = monotonic
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._where = f"Lease {namespace}/{name}"
        self._outage = Outage(
            log,
            f"leader election for {self._where} as {identity}",
            f"a leader steps down {renew_deadline_s:g} s after its last renewal",
        )
        self._lock = threading.Lock()
        self._term: int | None = None
        self._valid_until = float("-inf")
        self._epoch = 0
        self._lease_uid = ""
        self._highest_epoch = 0
        self._outranked = 0
        self._annotate = annotate
        self.inherited: dict[str, str] = {}
        """The Lease's annotations as this replica found them when its term began."""
        self._written: dict[str, Any] | None = None
        """The Lease as our last write left it (the release starts from it)."""
        self._seen: tuple[str, float] = ("", 0.0)
        self._lapses = float("-inf")
        """Monotonic time the claim our last read waited on lapses (-inf: no wait was decided)."""
        self._last_error = "no answer yet"
        self._leading = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start campaigning in the background (once)."""
        if self._thread is not None:
            raise RuntimeError(f"the elector for {self._where} was already started")
        self._thread = threading.Thread(
            target=self._run, name=f"leader-election-{self.name}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop leading (releasing the Lease so a standby takes over at once) and end the thread;
        waits at most `timeout` s (default: long enough for three bounded API calls)."""
        self._stopping.set()
        thread = self._thread
        if thread is None:
            self._client.close()
        if thread is None or thread is threading.current_thread():
            return
        thread.join(3 * self.renew_deadline_s + 1 if timeout is None else timeout)
        if thread.is_alive():
            log.warning("%s: the elector's thread is stuck in an API call", self._where)

    def is_leader(self) -> bool:
        """Whether we lead now: a term began and its last renewal is under renew_deadline_s old."""
        with self._lock:
            return self._term is not None and self._monotonic() < self._valid_until

    @property
    def epoch(self) -> int:
        """The current term's epoch while leading (after stepping down: the last one; 0 before)."""
        with self._lock:
            return self._epoch

    @property
    def lease_uid(self) -> str:
        """The UID of the Lease object the current (or last) term's epoch counts in."""
        with self._lock:
            return self._lease_uid

    @property
    def failing(self) -> str:
        """Why the latest attempt to read or write the Lease failed ("" if it was answered)."""
        return self._outage.last

    def holds(self, epoch: int, lease_uid: str) -> bool:
        """Whether the Lease, read now from the API server, records our term `epoch` in the
        Lease object `lease_uid` (from any thread; raises if the API server does not answer)."""
        obj = self._read(self.renew_deadline_s)
        if obj is None:
            return False
        lease = lease_record(obj)
        uid = (obj.get("metadata") or {}).get("uid", "")
        return lease.holder == self.identity and lease.transitions == epoch and uid == lease_uid

    def wait_leading(self, timeout: float) -> bool:
        """Whether we lead within `timeout` seconds."""
        return self._leading.wait(timeout) and self.is_leader()

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                if self._attempt() == "conflict" and not self._stopping.is_set():
                    self._attempt()  # someone else wrote the Lease: re-read it at once
                self._step_down_if_late()
                self._stopping.wait(self._pause())
        finally:
            if self._term is not None:
                self._step_down("the elector stopped", logging.INFO)
                self._release()
            self._client.close()

    def outrank(self, epoch: int) -> None:
        """Others obey `epoch` (the Lease was recreated and counts from 1 again): step down and
        take the Lease again above it at the next attempt."""
        with self._lock:
            self._outranked = max(self._outranked, epoch)

    def _attempt(self) -> str:
        """Read the Lease, decide, and write it; "ok", "conflict" or "failed"."""
        with self._lock:
            above, self._outranked = self._outranked, 0
        if above:
            self._highest_epoch = max(self._highest_epoch, above)
            if self._term is not None and self._term <= above:
                self._step_down(f"agents obey epoch {above}: taking {self._where} again above it")
        now, began = self._clock(), self._monotonic()
        self._lapses = float("-inf")
        try:
            obj = self._read(self._request_timeout(began))
        except Exception as err:
            return self._failed(err)
        lease = lease_record(obj) if obj is not None else None
        me = Candidate(self.identity, self.lease_duration_s, self._term, self._highest_epoch)
        decision = decide(lease, me, now, self._seen_at(lease, now, began))
        if lease is not None:
            self._highest_epoch = max(self._highest_epoch, lease.transitions)
        if decision.action is Action.WAIT:
            self._lapses = self._seen[1] + (decision.lease.duration_s or self.lease_duration_s)
            if self._term is not None:
                self._step_down(f"{self._where} is now held by {decision.lease.holder}")
            self._outage.answered()
            return "ok"
        if decision.action is Action.TAKE and self._term is not None:
            self._step_down(f"{self._where} no longer records our epoch {self._term}")
        base = obj or {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {}}
        try:
            body = lease_object(decision.lease, base)
            self._carry(body, decision.action, base)
            written = self._write(body, self._request_timeout(self._monotonic()))
        except Exception as err:
            if getattr(err, "status", None) == 409:
                self._outage.answered()
                return "conflict"
            return self._failed(err)
        self._outage.answered()
        self._written = written
        epoch = lease_record(written).transitions
        self._highest_epoch = max(self._highest_epoch, epoch)
        if decision.action is Action.TAKE:
            self._begin(epoch, str((written.get("metadata") or {}).get("uid", "")), began)
        else:
            with self._lock:
                self._valid_until = began + self.renew_deadline_s
        return "ok"

    def _carry(self, body: dict[str, Any], action: Action, base: dict[str, Any]) -> None:
        """On a takeover keep what the Lease carries (and note it); on a renewal, update it."""
        found = dict((base.get("metadata") or {}).get("annotations") or {})
        if action is Action.TAKE:
            self.inherited = found
        elif self._annotate is not None:
            body["metadata"]["annotations"] = {**found, **self._annotate()}

    def _failed(self, err: BaseException) -> str:
        self._last_error = api_error_reason(err)
        self._outage.failed(err, self.retry_period_s)
        return "failed"

    def _seen_at(self, lease: LeaseRecord | None, now: float, began: float) -> float | None:
        """When we first saw this version of the Lease (once its read returned), measured on the
        monotonic clock and told on the wall clock as an offset from `now`, read at `began`."""
        if lease is None:
            return None
        if lease.resource_version != self._seen[0]:
            self._seen = (lease.resource_version, self._monotonic())
        return now + (self._seen[1] - began)

    def _request_timeout(self, now: float) -> float:
        """A leader's call ends by its deadline; a standby's within renew_deadline_s."""
        if self._term is None:
            return self.renew_deadline_s
        return max(min(self._valid_until - now, self.renew_deadline_s), 0.001)

    def _pause(self) -> float:
        """Until the next attempt: a retry period, but never past a leader's deadline, nor (for
        a standby) past the lapse of the claim it waits on, so a dead leader is replaced within
        the Lease's duration plus one retry period of its last renewal, not two."""
        if self._term is None:
            if self._lapses == float("-inf"):  # no claim to wait on: an error, a conflict
                return self.retry_period_s
            lapse = self._lapses + LAPSE_MARGIN_S - self._monotonic()
            return max(min(self.retry_period_s, lapse), 0.0)
        return max(min(self.retry_period_s, self._valid_until - self._monotonic()), 0.0)

    def _begin(self, epoch: int, lease_uid: str, renewed_at: float) -> None:
        with self._lock:
            self._term, self._epoch, self._lease_uid = epoch, epoch, lease_uid
            self._valid_until = renewed_at + self.renew_deadline_s
        log.info("%s: %s leads in epoch %d", self._where, self.identity, epoch)
        self._leading.set()
        self._call(self._on_started, epoch)

    def _step_down_if_late(self) -> None:
        if self._term is not None and self._monotonic() >= self._valid_until:
            why = f"could not renew {self._where} for {self.renew_deadline_s:g} s"
            self._step_down(f"{why} ({self._last_error})")

    def _step_down(self, reason: str, level: int = logging.WARNING) -> None:
        with self._lock:
            epoch, self._term = self._term, None
        self._leading.clear()
        log.log(
            level, "%s: %s leads no more (epoch %s): %s", self._where, self.identity, epoch, reason
        )
        self._call(self._on_stopped, reason)

    def _call(self, callback: Callable[[Any], object] | None, arg: Any) -> None:
        try:
            if callback is not None:
                callback(arg)
        except Exception as err:
            log.error("%s: a callback raised %s: %s", self._where, type(err).__name__, err)

    def _release(self) -> None:
        """Clear holderIdentity (if the Lease is as we left it): a standby need not wait."""
        if self._written is None:
            return
        released = replace(lease_record(self._written), holder="", renew_time=self._clock())
        try:
            self._write(lease_object(released, self._written), self.renew_deadline_s)
        except Exception as err:
            level = logging.INFO if getattr(err, "status", None) == 409 else logging.WARNING
            log.log(level, "%s: not released: %s", self._where, api_error_reason(err))
            return
        log.info("%s: released by %s in epoch %d", self._where, self.identity, released.transitions)

    def _read(self, timeout: float) -> dict[str, Any] | None:
        try:
            answer = self._api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=timeout
            )
        except Exception as err:
            if getattr(err, "status", None) == 404:
                return None
            raise
        return dict(json.loads(answer.data))

    def _write(self, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Create the Lease (no resourceVersion) or replace it (409 when it changed meanwhile)."""
        body["metadata"].update(name=self.name, namespace=self.namespace)
        kwargs = {"_preload_content": False, "_request_timeout": timeout}
        if body["metadata"].get("resourceVersion"):
            answer = self._api.replace_namespaced_lease(self.name, self.namespace, body, **kwargs)
        else:
            answer = self._api.create_namespaced_lease(self.namespace, body, **kwargs)
        return dict(json.loads(answer.data))
