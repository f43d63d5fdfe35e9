"""The real node as the tests use it: kubectl, bounded waits on pods, the daemons' HTTP ports."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

from baton.contract import names
from commands.localnode import LocalNode, procs
from commands.localnode.procs import LocalNodeError

T = TypeVar("T")
Obj = dict[str, Any]
AGENT_URL = f"http://127.0.0.1:{names.PORT_AGENT}"
DEVICE_PLUGIN_URL = f"http://127.0.0.1:{names.PORT_DEVICE_PLUGIN}"
EXTENDER_URL = f"http://127.0.0.1:{names.PORT_EXTENDER}"


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, every: float = 0.3) -> T:
    """`probe()` until it returns a value; AssertionError naming `what` after `timeout` s."""
    try:
        return procs.wait_for(what, probe, timeout, every)
    except LocalNodeError as err:
        raise AssertionError(str(err)) from None


def wait_seen(
    what: str, read: Callable[[], T], done: Callable[[T], bool], timeout: float, every: float = 0.3
) -> T:
    """`read()` until `done(value)`; AssertionError naming `what` and the last value read."""
    seen: list[T] = []

    def probe() -> tuple[T] | None:
        seen[:] = [read()]
        return (seen[0],) if done(seen[0]) else None

    try:
        return wait_for(what, probe, timeout, every)[0]
    except AssertionError as err:
        last = repr(seen[0]) if seen else "nothing (never read)"
        raise AssertionError(f"{err}; last seen: {last}") from None


def get_text(url: str) -> str:
    """GET a document from a daemon on loopback."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        return str(reply.read().decode())


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus sample's values over series with these labels."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        series, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in series for k, v in labels.items()):
            total += float(value)
    return total


STALE_CLAIM_RETRIES = 3
"""Times `Cluster.wait_phase` creates again a pod kube-scheduler refused for its DRA claims.
Seen with v1.36.2: a pod created just after others' claims were deleted is refused ("cannot
allocate all claims") while the scheduler still counts those claims, and is not tried again
when their deletion reaches it (docs/dra.md); a new pod is tried at once. A pod that truly
does not fit is refused every time and still fails its wait, with its events."""


class Cluster:
    """kubectl and waits over one LocalNode with Baton installed."""

    def __init__(self, node: LocalNode) -> None:
        self.node = node
        self.node_name = node.node_name
        self._pods: dict[tuple[str, str], Obj] = {}

    def kubectl(self, *args: str, timeout: float = 60.0, stdin: str | None = None) -> str:
        """kubectl as the cluster admin; stdout (LocalNodeError when it fails)."""
        return self.node.kubectl(*args, timeout=timeout, stdin=stdin)

    def try_kubectl(self, *args: str) -> str | None:
        """kubectl, or None when it fails."""
        try:
            return self.node.kubectl(*args, timeout=30)
        except LocalNodeError:
            return None

    def get(self, *args: str) -> Obj:
        """`kubectl get ... -o json` decoded."""
        return dict(json.loads(self.kubectl("get", *args, "-o", "json")))

    def apply(self, *objects: Obj) -> None:
        """`kubectl apply` these objects (pods are remembered as written, for `wait_phase`)."""
        for obj in objects:
            if obj.get("kind") == "Pod":
                meta = obj["metadata"]
                self._pods[(meta.get("namespace", "default"), meta["name"])] = obj
        doc = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
        self.kubectl("apply", "-f", "-", stdin=json.dumps(doc))

    def pod(self, namespace: str, name: str) -> Obj:
        """A pod as the API server has it."""
        return self.get("pod", "-n", namespace, name)

    def wait_phase(self, namespace: str, name: str, phases: set[str], timeout: float) -> Obj:
        """The pod once its phase is one of `phases`; fails early on one it can't leave."""
        final = {"Succeeded", "Failed"} - phases
        retries = iter(range(STALE_CLAIM_RETRIES))

        def reached() -> Obj | None:
            pod = self.pod(namespace, name)
            phase = pod.get("status", {}).get("phase")
            written = self._pods.get((namespace, name))
            if (
                phase == "Pending"
                and written
                and self._refused_on_claims(pod)
                and next(retries, None) is not None
            ):
                self._recreate(written)
                return None
            if phase in final:  # its own last words first: long reports are cut in the middle
                said = self.logs(namespace, name).splitlines()
                raise AssertionError(
                    f"pod {namespace}/{name} ended {phase}; the end of its log:\n"
                    + "\n".join(said[-40:])
                    + f"\n\n{self.describe(namespace, name)}\nthe agent's log:\n"
                    + self.agent_log_tail()
                )
            return pod if phase in phases else None

        try:
            return wait_for(f"pod {namespace}/{name} to be {'/'.join(phases)}", reached, timeout)
        except AssertionError as err:
            if "did not happen within" not in str(err):
                raise
            # still pending or running: its events say why
            raise AssertionError(f"{err}\n{self.describe(namespace, name)}") from None

    def _refused_on_claims(self, pod: Obj) -> bool:
        """Whether kube-scheduler has refused this very pod (by uid) for its DRA claims."""
        if pod["spec"].get("nodeName") or not pod["spec"].get("resourceClaims"):
            return False
        meta = pod["metadata"]
        events = self.get(
            "events", "-n", meta["namespace"],
            "--field-selector", f"involvedObject.uid={meta['uid']},reason=FailedScheduling",
        )  # fmt: skip
        return any("cannot allocate all claims" in e.get("message", "") for e in events["items"])

    def _recreate(self, pod: Obj) -> None:
        """The pod again, as the test wrote it: a new pod is tried at once (STALE_CLAIM_RETRIES)."""
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        print(f"pod {ns}/{name} refused for its claims: created again")
        self.kubectl("delete", "pod", "-n", ns, name, "--grace-period=0", "--force")
        self.apply(pod)

    def wait_succeeded(self, namespace: str, *pods: str, timeout: float = 90.0) -> None:
        """Every pod Succeeded (AssertionError with its description if one fails)."""
        deadline = time.monotonic() + timeout
        for name in pods:
            self.wait_phase(namespace, name, {"Succeeded"}, max(1.0, deadline - time.monotonic()))

    def agent_log_tail(self, lines: int = 60) -> str:
        """The last lines of the running agent's log ('' when it cannot be read)."""
        found = self.try_kubectl(
            "logs",
            "-n",
            names.NAMESPACE,
            "-l",
            "app.kubernetes.io/name=baton-agent",
            f"--tail={lines}",
        )
        return found or ""

    def timeline(self, namespace: str) -> str:
        """A line per pod of `namespace`: its phase, when it was scheduled, and when each of its
        containers started and finished (what overlapped with what, after the fact); then the
        namespace's events (a scheduling refusal says why)."""
        listed = self.try_kubectl("get", "pods", "-n", namespace, "-o", "json")
        if listed is None:  # said beside another failure: it must not replace that one
            return f"(the pods of {namespace} could not be listed)"
        lines = []
        for pod in json.loads(listed)["items"]:
            status = pod.get("status", {})
            scheduled = next(
                (c.get("lastTransitionTime") for c in status.get("conditions") or []
                 if c.get("type") == "PodScheduled" and c.get("status") == "True"),
                None,
            )  # fmt: skip
            ran = []
            for c in status.get("containerStatuses") or []:
                state = c.get("state", {})
                for key in ("running", "terminated"):
                    if key in state:
                        ran.append(f"{c['name']} started {state[key].get('startedAt')}")
                if "terminated" in state:
                    ran.append(f"finished {state['terminated'].get('finishedAt')}")
            lines.append(
                f"{pod['metadata']['name']}: {status.get('phase')}, scheduled {scheduled}, "
                + (", ".join(ran) or "no container started")
            )
        events = self.try_kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp")
        return "\n".join([*lines, events or "(no events)"])

    def describe(self, namespace: str, name: str) -> str:
        """`kubectl describe pod`, as a user reads it."""
        return self.try_kubectl("describe", "pod", "-n", namespace, name) or ""

    def logs(self, namespace: str, name: str, container: str | None = None) -> str:
        """`kubectl logs` of a pod (through the API server and the kubelet)."""
        extra = ["-c", container] if container else []
        return self.kubectl("logs", "-n", namespace, name, *extra)

    def daemon_pod(self, app: str) -> Obj:
        """The one running, ready pod of a Baton daemon (by app.kubernetes.io/name)."""

        def ready() -> Obj | None:
            items = self.get("pods", "-n", names.NAMESPACE, "-l", f"app.kubernetes.io/name={app}")
            for pod in items["items"]:
                statuses = pod.get("status", {}).get("containerStatuses") or []
                gone = pod["metadata"].get("deletionTimestamp")
                if not gone and statuses and all(s.get("ready") for s in statuses):
                    return dict(pod)
            return None

        return wait_for(f"a ready {app} pod", ready, 90.0)

    def allocatable_gpus(self) -> int:
        """The node's allocatable baton.dev/gpu (0 while no plugin is registered)."""
        node = self.get("node", self.node_name)
        return int(node["status"].get("allocatable", {}).get(names.RESOURCE_GPU, "0"))

    def kubelet_allocations(self) -> dict[tuple[str, str], list[str]]:
        """(pod UID, container) → device IDs, from the kubelet's device manager checkpoint."""
        path = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
        with open(path) as f:
            data = json.load(f)["Data"]
        found: dict[tuple[str, str], list[str]] = {}
        for entry in data.get("PodDeviceEntries") or []:
            if entry["ResourceName"] != names.RESOURCE_GPU:
                continue
            ids = [i for per_numa in entry["DeviceIDs"].values() for i in per_numa]
            found[(entry["PodUID"], entry["ContainerName"])] = ids
        return found
