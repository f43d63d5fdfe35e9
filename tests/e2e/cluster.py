"""The control plane's side of the end-to-end node: kube-scheduler's extender calls, the kubelet.

`Scheduler` replays what kube-scheduler sends to an extender configured with
`nodeCacheCapable: true` and filter, prioritize and bind verbs, byte for byte in its wire format
(PascalCase keys, `null` for the unused node list). `Kubelet` admits a bound pod through the
kubelet stub (GetPreferredAllocation, Allocate) and starts its container as a local process with
the env and mounts the Allocate response gave it. Like a container runtime it puts the process
in its pod's cgroup before the process runs: here that is the `cgroup` file of a simulated
`/proc` tree (the agent's `--proc-root`), since this machine runs no kubepods cgroups.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baton._pb import api_pb2
from baton.contract import names
from tests.e2e.processes import ROOT, container_command
from tests.harness.fakeapi import FakeApiServer
from tests.harness.kubelet import KubeletStub
from tests.harness.podresources import ContainerAsk

EXTENDER_WEIGHT = 1
MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10


@dataclass
class Placement:
    """What the scheduler decided for one pod."""

    passed: list[str]
    failed: dict[str, str]
    scores: dict[str, int]
    node: str


class Scheduler:
    """kube-scheduler's extender client: filter → prioritize (≥ 2 feasible nodes) → bind."""

    def __init__(self, url: str, api: FakeApiServer, nodes: list[str]) -> None:
        self.url = url.rstrip("/")
        self.api = api
        self.nodes = nodes

    def _post(self, verb: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            f"{self.url}/{verb}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as reply:
            assert reply.status == 200, f"failed {verb} with extender at URL {self.url}"
            return json.load(reply)

    def schedule(self, name: str, namespace: str = "default") -> Placement:
        """One scheduling cycle for a pending pod; raises if the extender reports an error."""
        pod = self.api.get_object("Pod", name, namespace)
        assert pod is not None, f"pod {namespace}/{name} does not exist"
        args = {"Pod": pod, "Nodes": None, "NodeNames": list(self.nodes)}
        result = self._post("filter", args)
        assert not result.get("Error"), result["Error"]
        passed = list(result.get("NodeNames") or [])
        failed = {**(result.get("FailedNodes") or {})}
        failed.update(result.get("FailedAndUnresolvableNodes") or {})
        assert passed, f"no node fits {name}: {failed}"
        scores = {node: 0 for node in passed}
        if len(passed) > 1:  # kube-scheduler scores only when there is a choice
            ranked = self._post("prioritize", {**args, "NodeNames": passed})
            for host in ranked:
                scale = EXTENDER_WEIGHT * MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY
                scores[host["Host"]] += int(host["Score"]) * scale
        node = max(passed, key=lambda n: scores[n])
        meta = pod["metadata"]
        binding = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": node,
        }
        answer = self._post("bind", binding)
        assert not answer.get("Error"), answer["Error"]
        return Placement(passed, failed, scores, node)


@dataclass
class Container:
    """A started tenant container."""

    pod: str
    devices: list[str]
    env: dict[str, str]
    mounts: list[tuple[str, str, bool]]
    proc: subprocess.Popen[str]


class Kubelet:
    """Admits pods bound to this node and runs their one container as a local process."""

    def __init__(self, stub: KubeletStub, api: FakeApiServer, node_root: Path, proc: Path) -> None:
        self.stub = stub
        self.api = api
        self.node_root = node_root
        self.proc = proc

    def host_path(self, path: str) -> str:
        """A host path of the simulated node, inside its root directory."""
        return str(self.node_root / path.lstrip("/"))

    def admit(self, name: str, namespace: str = "default") -> Container:
        """Allocate the pod's `baton.dev/gpu` devices, start its container, mark it Running."""
        pod = self.api.get_object("Pod", name, namespace)
        assert pod is not None and pod["spec"].get("nodeName"), f"{name} is not bound"
        spec = pod["spec"]["containers"][0]
        count = int(spec["resources"]["limits"][names.RESOURCE_GPU])
        admitted = self.stub.admit_pod(namespace, name, [ContainerAsk(spec["name"], count)], [])
        devices = admitted.devices[spec["name"]]
        response = admitted.answers[spec["name"]]
        env = {e["name"]: e["value"] for e in spec.get("env", [])}
        env.update(response.envs)
        env.update(HOSTNAME=name, PATH=os.environ["PATH"], PYTHONPATH=str(ROOT))
        mounts = [*self._volume_mounts(pod, spec), *self._allocate_mounts(response)]
        argv = [sys.executable if a == "python" else a for a in [*spec["command"], *spec["args"]]]
        proc = subprocess.Popen(
            container_command(argv, mounts, os.geteuid() == 0),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
        )
        self._place_in_pod_cgroup(proc.pid, pod["metadata"]["uid"])
        self._set_phase(name, namespace, "Running")
        return Container(name, devices, env, mounts, proc)

    def _set_phase(self, name: str, namespace: str, phase: str) -> None:
        """The kubelet's status update (the status only: annotations written meanwhile stay)."""
        pod = self.api.get_object("Pod", name, namespace)
        assert pod is not None
        pod["status"] = {**pod.get("status", {}), "phase": phase}
        self.api.put_object(pod)

    def _place_in_pod_cgroup(self, pid: int, pod_uid: str) -> None:
        """What the kernel would show in /proc/<pid>/cgroup for a container of the pod."""
        slice_uid = pod_uid.replace("-", "_")
        path = (
            "/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{slice_uid}.slice/cri-containerd-{uuid.uuid4().hex}.scope"
        )
        (self.proc / str(pid)).mkdir(parents=True)
        (self.proc / str(pid) / "cgroup").write_text(f"0::{path}\n")

    def release(self, container: Container) -> None:
        """Let the container's process run."""
        assert container.proc.stdin is not None
        container.proc.stdin.write("go\n")
        container.proc.stdin.flush()

    def _allocate_mounts(
        self, response: api_pb2.ContainerAllocateResponse
    ) -> list[tuple[str, str, bool]]:
        return [
            (self.host_path(m.host_path), m.container_path, m.read_only) for m in response.mounts
        ]

    def _volume_mounts(
        self, pod: dict[str, Any], spec: dict[str, Any]
    ) -> list[tuple[str, str, bool]]:
        volumes = {v["name"]: v["hostPath"]["path"] for v in pod["spec"].get("volumes", [])}
        return [
            (self.host_path(volumes[m["name"]]), m["mountPath"], bool(m.get("readOnly")))
            for m in spec.get("volumeMounts", [])
        ]

    def finished(self, container: Container, succeeded: bool) -> None:
        """The container exited: report the pod's phase as the kubelet would."""
        self._set_phase(container.pod, "default", "Succeeded" if succeeded else "Failed")
