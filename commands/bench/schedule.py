"""`baton bench schedule`: tenant pods through the real kube-scheduler, with and without Baton.

One control plane (etcd, kube-apiserver) from the Kubernetes binaries, nodes made through the
API with Baton's annotations and capacity and no kubelet, and the same pods scheduled twice:
by a profile with the Baton extender (`baton extender` as a process; kube-scheduler calls its
filter, prioritize and bind over HTTP) and, as the same run's reference, by a profile without
it (the extender's two ignored resources ignored by NodeResourcesFit instead). Each profile has
a kube-scheduler of its own with the same client rate limits, raised above the pod rate so
that neither is throttled by its own client.

Per profile, two measurements:
- throughput: every pod is created while its scheduler is stopped, then the scheduler starts;
  pods per second from its first bind to its last. The two profiles take turns for `rounds`
  rounds (reference first in odd rounds, Baton first in even ones, so a drift of the shared
  machine weighs on both alike); the figures are each profile's median and the ratio of the
  medians, with every round's figure beside them. The `steady_` figures count the middle 90%
  of the binds only: now and then the last few pods of a run bind 0.3-1.2 s after the others
  (seen with the reference profile), which stretches the first-to-last span;
- latency: with the scheduler running, pods are created one by one at a steady rate well below
  that throughput; create → bound, as the bench's watch sees it.

With `path="dra"` three more profiles take their turns in every round and in the latency run:
the DRA overlay's `baton-scheduler` profile (`manifests/overlays/dra`), placing the same pods'
shares as claims through DRA from each node's ResourceSlice (`drafleet`), with its own
extender run as the overlay runs it (`--dra`, filter and prioritize); the same profile
without the extender (DRA alone: the scheduler's DynamicResources plugin allocating from
Baton's slices); and the same profile calling an extender that decides nothing
(`nullextender`: what the two round trips per pod cost any extender). The DRA profile's figure
is given against DRA alone (`dra_vs_dra_alone_ratio`: what Baton's extender costs on the DRA
path) and against the null extender (`dra_vs_dra_null_ratio`: what Baton's decisions cost
beyond the round trips); DRA alone against the plain reference is what DRA itself costs
(`dra_alone_throughput_ratio`).

Everything runs on the same machine, so a profile's throughput is bounded by the CPU that
etcd, kube-apiserver, kube-scheduler (and the extender) share: the ratio, not the absolute
figure, is what carries over to another machine.
"""

from __future__ import annotations

import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from baton.contract.kube import load_api_client
from baton.contract.names import SCHEDULER_NAME
from commands.bench import drafleet, fleet
from commands.bench.schedprofiles import (
    BIND_TIMEOUT_S,
    DRA,
    DRA_ALONE,
    DRA_NULL,
    DRA_PROFILES,
    PATHS,
    REFERENCE,
    claims,
    pods,
    scheduler_config,
)
from commands.localnode.controlplane import ControlPlane, free_ports
from commands.localnode.procs import Process, wait_for

NAMESPACE = "baton-bench"


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of a non-empty list."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


class Bench:
    """The control plane, the extender and one scheduler process at a time."""

    def __init__(self, root: Path, nodes: int, path: str = "extender") -> None:
        """With `path="dra"` each node also gets its ResourceSlice (and the DeviceClass)."""
        if path not in PATHS:
            raise ValueError(f"path must be one of {', '.join(PATHS)}, not {path!r}")
        self.root = root
        self.nodes = nodes
        self.path = path
        self.plane = ControlPlane(
            root / "plane", controller_manager=False, scheduler=False, ports="free"
        )
        self.extender: Process | None = None
        self.extender_url = ""
        self.dra_extender: Process | None = None
        self.dra_extender_url = ""
        """With `path="dra"`: the DRA profile's own extender (`--dra`), as the overlay runs it."""
        self.null_extender: Process | None = None
        self.null_extender_url = ""
        """With `path="dra"`: the extender that decides nothing, for `DRA_NULL`."""

    @contextmanager
    def running(self) -> Iterator[Bench]:
        """Everything up for the block; everything stopped after it, also on failure."""
        try:
            self.plane.start()
            api_client = load_api_client(str(self.plane.admin_kubeconfig))
            self.api = client.CoreV1Api(api_client)
            self.custom = client.CustomObjectsApi(api_client)
            fleet.make_namespace(self.api, NAMESPACE)
            node_names = [f"bench-node-{i:04d}" for i in range(self.nodes)]
            fleet.make_nodes(self.api, node_names)
            if self.path == "dra":
                drafleet.make_slices(self.custom, node_names)
            self.extender, self.extender_url = self._start_extender()
            if self.path == "dra":
                self.dra_extender, self.dra_extender_url = self._start_extender(dra=True)
                self.null_extender, self.null_extender_url = self._start_null_extender()
            yield self
        finally:
            for extender in (self.null_extender, self.dra_extender, self.extender):
                if extender is not None:
                    extender.stop()
            self.plane.close()

    def _start_extender(self, dra: bool = False) -> tuple[Process, str]:
        (port,) = free_ports(1)
        url = f"http://127.0.0.1:{port}"
        argv = [
            sys.executable,
            "-m",
            "baton",
            "extender",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        # kube-scheduler's own identity, as for the binds of the reference profile: the same
        # RBAC and the same API Priority and Fairness level (the admin's would be exempt).
        kubeconfig = self.plane.root / "kube-scheduler.kubeconfig"
        argv += ["--kubeconfig", str(kubeconfig), "--log-level", "WARNING"]
        if dra:  # the DRA overlay's extender
            argv += ["--dra", "--policy", "complement"]
        name = "baton-extender-dra" if dra else "baton-extender"
        return self._start_answering(name, argv, port), url

    def _start_null_extender(self) -> tuple[Process, str]:
        (port,) = free_ports(1)
        argv = [sys.executable, "-m", "commands.bench.nullextender", str(port)]
        return self._start_answering("null-extender", argv, port), f"http://127.0.0.1:{port}"

    def _start_answering(self, name: str, argv: list[str], port: int) -> Process:
        """Start `argv` (logging to `<name>.log`) and wait until it answers HTTP on `port`;
        stopped again if it does not."""
        process = Process(name, argv, self.root / f"{name}.log").start()
        try:
            wait_for(f"{name} to be ready", lambda: _answers(process, port), 60.0, every=0.1)
        except BaseException:
            process.stop()
            raise
        return process

    @contextmanager
    def scheduler(self, profile: str) -> Iterator[None]:
        """A kube-scheduler serving `profile` for the block."""
        url = {
            REFERENCE: None,
            DRA_ALONE: None,
            DRA: self.dra_extender_url,
            DRA_NULL: self.null_extender_url,
        }.get(profile, self.extender_url)
        kubeconfig = self.plane.root / "kube-scheduler.kubeconfig"
        path = self.root / f"{profile}.yaml"
        path.write_text(yaml.safe_dump(scheduler_config(kubeconfig, profile, url)))
        argv = [str(self.plane.binaries.kube_scheduler), f"--config={path}", "--secure-port=0"]
        proc = Process(profile, argv, self.root / f"{profile}.log").start()
        try:
            yield
        finally:
            proc.stop()

    def pods(self, profile: str, prefix: str, count: int) -> list[dict[str, Any]]:
        """`pods(profile, prefix, count)`, with their claims made first on a DRA profile."""
        if profile in DRA_PROFILES:
            drafleet.create_claims(self.custom, NAMESPACE, claims(prefix, count, profile))
        return pods(profile, prefix, count)

    def clear(self, profile: str) -> None:
        """Remove a profile's pods (and on a DRA profile their claims)."""
        fleet.delete_pods(self.api, NAMESPACE, profile)
        if profile in DRA_PROFILES:
            drafleet.delete_claims(self.custom, NAMESPACE, profile)

    def throughput(self, profile: str, count: int, tag: str) -> tuple[float, float, int]:
        """Pods per second for `count` pods waiting when the scheduler starts: first bind to
        last, and over the middle 90% of binds (steady, without the first and last pods'
        stragglers); and how many API requests kube-apiserver refused with 429 meanwhile. Its
        pods are removed afterwards."""
        watch = fleet.BindWatch(self.api, NAMESPACE).start()
        try:
            burst = self.pods(profile, f"{profile}-{tag}", count)
            fleet.create_pods(self.api, NAMESPACE, burst)
            refused = self.refused_requests()
            with self.scheduler(profile):
                watch.wait_bound((p["metadata"]["name"] for p in burst), BIND_TIMEOUT_S)
            refused = self.refused_requests() - refused
            times = sorted(watch.bound[p["metadata"]["name"]] for p in burst)
        finally:
            watch.stop()
        self.clear(profile)
        steady = _rate(times[len(times) // 20 : len(times) - len(times) // 20])
        return _rate(times), steady, refused

    def refused_requests(self) -> int:
        """Requests kube-apiserver has refused with 429 so far (its API Priority and Fairness
        turning work away), from its own metrics."""
        api_client = self.api.api_client  # the admin kubeconfig: its client certificate
        url = f"{api_client.configuration.host}/metrics"
        answer = api_client.rest_client.pool_manager.request("GET", url, timeout=30.0)
        if answer.status != 200:
            raise RuntimeError(f"reading kube-apiserver's /metrics: HTTP {answer.status}")
        return refused_in(answer.data.decode())

    def latency(self, profile: str, count: int, rate: float) -> dict[str, float]:
        """Create → bound of `count` pods created at `rate` per second while the scheduler
        runs; its pods are removed afterwards."""
        watch = fleet.BindWatch(self.api, NAMESPACE).start()
        try:
            with self.scheduler(profile):
                # One pod first, so the pacing starts once the scheduler has synced and serves.
                (warm,) = self.pods(profile, f"{profile}-w", 1)
                fleet.create_pods(self.api, NAMESPACE, [warm])
                watch.wait_bound([warm["metadata"]["name"]], BIND_TIMEOUT_S)
                paced = self.pods(profile, f"{profile}-l", count)
                start = time.monotonic()
                gate = threading.Event()

                def pace(i: int) -> None:
                    gate.wait(max(0.0, start + i / rate - time.monotonic()))

                sent = fleet.create_pods(self.api, NAMESPACE, paced, pace=pace)
                watch.wait_bound(sent, BIND_TIMEOUT_S)
            latencies = [(watch.bound[name] - at) * 1000 for name, at in sent.items()]
        finally:
            watch.stop()
        self.clear(profile)
        return {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99)}


def refused_in(metrics: str) -> int:
    """The sum of `apiserver_request_total` over the series with code 429."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("apiserver_request_total{") and 'code="429"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def _answers(process: Process, port: int) -> bool | None:
    """Whether the process answers HTTP on the port (it must still run)."""
    process.check()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.sendall(b"GET /readyz HTTP/1.0\r\n\r\n")
            return True if b" 200 " in conn.recv(64) else None
    except OSError:
        return None


def _rate(times: list[float]) -> float:
    """Binds per second from the first of `times` (sorted) to the last."""
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return (len(times) - 1) / span if span > 0 else float("inf")


def run(
    nodes: int,
    pods_count: int,
    latency_pods: int,
    rate: float,
    rounds: int = 3,
    path: str = "extender",
) -> dict[str, Any]:
    """Every profile of `path` over the same nodes and pods; one dict of figures (the DRA
    profile's under `dra_` keys, DRA alone's under `dra_alone_`)."""
    if rounds < 1:
        raise ValueError(f"rounds must be 1 or more, not {rounds}")
    profiles = (REFERENCE, SCHEDULER_NAME) + (DRA_PROFILES if path == "dra" else ())
    rates: dict[str, list[float]] = {p: [] for p in profiles}
    steady: dict[str, list[float]] = {p: [] for p in profiles}
    refused: dict[str, list[int]] = {p: [] for p in profiles}
    latency: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="baton-bench-schedule-") as tmp:
        bench = Bench(Path(tmp), nodes, path)
        with bench.running():
            for index in range(rounds):
                # The reference first in odd rounds, last in even ones.
                order = profiles if index % 2 == 0 else profiles[::-1]
                for profile in order:
                    whole, middle, turned_away = bench.throughput(profile, pods_count, f"t{index}")
                    rates[profile].append(whole)
                    steady[profile].append(middle)
                    refused[profile].append(turned_away)
            for profile in profiles:
                latency[profile] = bench.latency(profile, latency_pods, rate)
    reference_rate = statistics.median(rates[REFERENCE])
    reference_steady = statistics.median(steady[REFERENCE])
    figures: dict[str, Any] = {
        "path": path,
        "pods": pods_count,
        "nodes": nodes,
        "gpus_per_node": fleet.GPUS_PER_NODE,
        "rounds": rounds,
    }
    prefixes = (
        (SCHEDULER_NAME, ""),
        (DRA, "dra_"),
        (DRA_ALONE, "dra_alone_"),
        (DRA_NULL, "dra_null_"),
    )
    for profile, prefix in prefixes:
        if profile not in profiles:
            continue
        baton_rate = statistics.median(rates[profile])
        baton_steady = statistics.median(steady[profile])
        figures |= {
            f"{prefix}pods_per_s": round(baton_rate, 1),
            f"{prefix}throughput_ratio": round(baton_rate / reference_rate, 3),
            f"{prefix}pods_per_s_rounds": [round(r, 1) for r in rates[profile]],
            f"{prefix}steady_pods_per_s": round(baton_steady, 1),
            f"{prefix}steady_throughput_ratio": round(baton_steady / reference_steady, 3),
            f"{prefix}refused_requests_rounds": refused[profile],
            f"{prefix}p50_schedule_ms": round(latency[profile]["p50"], 1),
            f"{prefix}p99_schedule_ms": round(latency[profile]["p99"], 1),
        }
    if path == "dra":
        alone = statistics.median(rates[DRA_ALONE])
        alone_steady = statistics.median(steady[DRA_ALONE])
        figures["dra_vs_dra_alone_ratio"] = round(statistics.median(rates[DRA]) / alone, 3)
        figures["dra_vs_dra_alone_steady_ratio"] = round(
            statistics.median(steady[DRA]) / alone_steady, 3
        )
        null = statistics.median(rates[DRA_NULL])
        figures["dra_null_vs_dra_alone_ratio"] = round(null / alone, 3)
        figures["dra_vs_dra_null_ratio"] = round(statistics.median(rates[DRA]) / null, 3)
    return figures | {
        "reference_pods_per_s": round(reference_rate, 1),
        "reference_pods_per_s_rounds": [round(r, 1) for r in rates[REFERENCE]],
        "reference_steady_pods_per_s": round(reference_steady, 1),
        "reference_refused_requests_rounds": refused[REFERENCE],
        "reference_p50_schedule_ms": round(latency[REFERENCE]["p50"], 1),
        "reference_p99_schedule_ms": round(latency[REFERENCE]["p99"], 1),
        "latency_pods": latency_pods,
        "latency_rate_per_s": rate,
    }
