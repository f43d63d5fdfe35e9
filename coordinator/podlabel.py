"""The leader's mark on its own pod, `baton.dev/coordinator-leader=true`, which the Service
selects: set while this replica leads, absent otherwise.

One thread keeps the label as the latest wish has it, retrying (with backoff) until the API
server takes it, so a removal still being retried cannot undo a later labelling. The wish at
start is "not leading": a replica restarted in a pod that a crashed leader had labelled removes
the mark, or the Service would keep sending calls to a standby.

A deposed leader cannot be trusted to remove its own mark: one frozen (SIGSTOP, a long pause) or
cut off from the API server keeps it, and the Service would keep sending calls to it. So the
label goes with annotations naming its term: the epoch, and the UID of the Lease the epoch counts
in (a Lease deleted and created again counts from 1 again). A new leader, once its own pod is
labelled, lists the labelled pods, reads the Lease (a deposed leader sweeps nothing), and removes
the label from every other pod of its Deployment labelled in an older epoch of its Lease, or under
another Lease: ours is the current one, so that one was deleted before ours was created (a leader
labels only once it holds its Lease), whatever its epochs. Each removal is a JSON patch that first
tests the pod's resourceVersion as listed: a label that a newer leader set on its pod meanwhile
fails the test, the pods are listed again, and its newer epoch keeps it. While it leads it
sweeps again every `RESWEEP_S` (a list by label): a deposed leader's own label write still in
flight (its process frozen with it) may land after a sweep. A sweep that finds this pod's own
label gone (an operator's `kubectl label`, another replica's mistake) while the Lease records our
term labels it again: the Service would have no endpoint, and callers would hang.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from baton.contract import names
from baton.contract.kube import Outage

log = logging.getLogger(__name__)

RETRY_FIRST_S = 1.0
RETRY_MAX_S = 10.0
REQUEST_TIMEOUT_S = 5.0
SWEEP_LISTS = 3
"""How often a sweep lists the pods again when they change under it, before it backs off."""
RESWEEP_S = 30.0
"""How often a leader sweeps again (an older leader's label write may land after its sweep)."""

LABEL = names.LABEL_COORDINATOR_LEADER
EPOCH = names.ANNOTATION_COORDINATOR_LEADER_EPOCH
LEASE = names.ANNOTATION_COORDINATOR_LEADER_LEASE
TEMPLATE_HASH = "pod-template-hash"
"""The label a Deployment adds to each revision's pods (the only one in which they differ)."""


class Term(NamedTuple):
    """A leader's term as its label names it: the epoch (0: not leading), and the UID of the
    Lease it counts in ("": not known, as an older version's label)."""

    epoch: int
    lease: str = ""


class Unlabelled(Exception):
    """A sweep found this pod unlabelled while the Lease records our term: it is labelled again."""


class PodsChanging(Exception):
    """The coordinator pods changed under every list of a sweep (it is tried again later)."""


class LeaderLabel:
    """`want(epoch, lease)` from any thread (0: not leading); `stop` when done. `patch(term)`
    writes the label (removes it for epoch 0); `sweep(term)`, once this pod is labelled, removes it
    from the pods of older leaders."""

    def __init__(
        self,
        patch: Callable[[Term], object],
        where: str,
        sweep: Callable[[Term], object] = lambda term: None,
    ) -> None:
        self._patch = patch
        self._sweep = sweep
        meanwhile = "the Service may reach the wrong replica"
        self._outage = Outage(log, f"the leader label on pod {where}", meanwhile)
        self._sweep_outage = Outage(log, f"the leader label on pods other than {where}", meanwhile)
        self._lock = threading.Lock()
        self._wanted = Term(0)
        self._applied: Term | None = None
        self._swept = Term(0)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-label", daemon=True)

    @classmethod
    def on_pod(
        cls, api_client: Any, namespace: str, pod: str, holds: Callable[[Term], bool]
    ) -> LeaderLabel:
        """The label of `namespace/pod`, through the API server; `holds(term)` reads the Lease
        and says whether it records that term of ours (a sweep asks)."""
        from kubernetes import client

        core = client.CoreV1Api(api_client)

        def patch(term: Term) -> None:
            leading = term.epoch > 0
            annotations = {EPOCH: str(term.epoch) if leading else None}
            annotations[LEASE] = term.lease if leading and term.lease else None
            body = {"metadata": {"labels": {LABEL: "true" if leading else None}}}
            body["metadata"]["annotations"] = annotations
            core.patch_namespaced_pod(pod, namespace, body, _request_timeout=REQUEST_TIMEOUT_S)

        def sweep_pods(term: Term) -> None:
            sweep(core, namespace, pod, term, holds)

        return cls(patch, f"{namespace}/{pod}", sweep_pods)

    def start(self) -> None:
        """Begin with the label removed (this replica does not lead yet)."""
        self._wake.set()
        self._thread.start()

    def want(self, epoch: int, lease: str = "") -> None:
        """The label as it should be from now: this replica leads in `epoch` of the Lease whose
        UID is `lease`, or not (0)."""
        with self._lock:
            self._wanted = Term(epoch, lease) if epoch else Term(0)
        self._wake.set()

    def applied(self) -> int | None:
        """The epoch the API server last took (0: the label removed; None before the first
        write)."""
        with self._lock:
            return None if self._applied is None else self._applied.epoch

    def stop(self, timeout: float = REQUEST_TIMEOUT_S + 1) -> None:
        """Stop, once the label is as last wished (one more try if it is not; bounded)."""
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        delay, idle = RETRY_FIRST_S, None
        relabel = 0.0  # the wait before labelling again a pod someone keeps unlabelling
        while True:
            woke = self._wake.wait(idle)
            with self._lock:
                if not woke:  # leading, swept a while ago: sweep again
                    self._swept = Term(0)
                wanted = self._wanted
                self._wake.clear()
                sweeping = wanted == self._applied
                idle = None
                leading = wanted.epoch > 0
                if sweeping and (not leading or self._swept == wanted or self._stopping.is_set()):
                    if self._stopping.is_set():
                        return
                    idle = RESWEEP_S if leading else None
                    continue
            step, outage = (
                (self._sweep, self._sweep_outage) if sweeping else (self._patch, self._outage)
            )
            try:
                step(wanted)
            except Unlabelled as err:
                log.warning("%s", err)
                with self._lock:
                    if self._applied == wanted:
                        self._applied = None
                self._stopping.wait(relabel)  # at once the first time; then backing off
                relabel = min(max(relabel * 2, RETRY_FIRST_S), RETRY_MAX_S)
                self._wake.set()
                continue
            except Exception as err:
                if self._stopping.is_set():
                    return
                outage.failed(str(err) if isinstance(err, PodsChanging) else err, delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                self._wake.set()
                continue
            outage.answered()
            delay = RETRY_FIRST_S
            with self._lock:
                if sweeping:
                    self._swept = wanted
                    relabel = 0.0
                else:
                    self._applied = wanted
            self._wake.set()  # look again: a newer wish, a sweep, or stopping


def sweep(
    core: Any, namespace: str, pod: str, term: Term, holds: Callable[[Term], bool]
) -> list[str]:
    """Remove the leader label from the other pods of `pod`'s Deployment labelled in an older
    term than `term`, if the Lease, read after the list, `holds` our term; the names of those it
    was removed from."""
    removed: list[str] = []
    for _ in range(SWEEP_LISTS):
        listed = core.list_namespaced_pod(
            namespace, label_selector=LABEL, _request_timeout=REQUEST_TIMEOUT_S
        )
        if not holds(term):
            log.info("the Lease no longer records our epoch %d: not sweeping", term.epoch)
            return removed
        stale = stale_leaders(listed.items, pod, term)
        if stale is None:
            raise Unlabelled(
                f"pod {namespace}/{pod} lost its leader label (someone else removed it) while "
                f"leading in epoch {term.epoch}: labelling it again"
            )
        changed = False
        for other in stale:
            name = other.metadata.name
            ops = [
                {
                    "op": "test",
                    "path": "/metadata/resourceVersion",
                    "value": other.metadata.resource_version,
                },
                {
                    "op": "remove",
                    "path": "/metadata/labels/" + LABEL.replace("~", "~0").replace("/", "~1"),
                },
            ]
            try:
                core.patch_namespaced_pod(
                    name,
                    namespace,
                    ops,
                    _content_type="application/json-patch+json",
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
            except Exception as err:
                status = getattr(err, "status", None)
                if status == 404:
                    continue  # gone, and its label with it
                if status in (409, 422):  # it changed since the list: look again
                    changed = True
                    continue
                raise
            removed.append(name)
            log.warning(
                "removed the leader label from pod %s/%s: set in epoch %d of Lease %s, older "
                "than our epoch %d of Lease %s, by a leader that did not remove it", namespace,
                name, *leader_term(other), *term,
            )  # fmt: skip
        if not changed:
            return removed
    raise PodsChanging(f"the coordinator pods changed under each of {SWEEP_LISTS} lists")


def stale_leaders(pods: list[Any], own: str, term: Term) -> list[Any] | None:
    """Of `pods` (labelled leader), the others of `own`'s Deployment (the pods with its labels
    but the revision's hash) labelled in an older term than `term` (the Lease's current one): in
    an older epoch, or under another Lease (one deleted since); None if `own` is not among
    them."""
    mine = next((p for p in pods if p.metadata.name == own), None)
    if mine is None:
        return None
    labels = (mine.metadata.labels or {}).items()
    selector = {(k, v) for k, v in labels if k not in (LABEL, TEMPLATE_HASH)}
    return [
        p
        for p in pods
        if p.metadata.name != own
        and selector <= (p.metadata.labels or {}).items()
        and older(leader_term(p), term)
    ]


def older(label: Term, current: Term) -> bool:
    """Whether a label's term is older than the Lease's `current` one: another Lease's (that
    Lease was deleted before the current one was created), or an older epoch of the same Lease
    (or of one the label does not name: an older version's)."""
    if label.lease and label.lease != current.lease:
        return True
    return label.epoch < current.epoch


def leader_term(pod: Any) -> Term:
    """The term a pod's leader label was set in (epoch 0 where it does not say: an older
    version's)."""
    annotations = pod.metadata.annotations or {}
    try:
        epoch = int(annotations.get(EPOCH, "0"))
    except ValueError:
        epoch = 0
    return Term(epoch, annotations.get(LEASE, ""))
