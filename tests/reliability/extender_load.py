"""The extender load run: concurrent scheduler clients while the watch delivers churn.

A real extender (cache, binder, HTTP app) runs in its own process, watching the fake API
server. `clients` scheduler processes (`scheduler_client.py`) each take pending pods and do what
kube-scheduler does (filter, prioritize, bind the best node), timing every HTTP call. Like
kube-scheduler, they share no interpreter with the API server: the test process keeps only the
fake API server, a feeder that hands out pending pods, and a churn thread that flips GPU health
on nodes, adds and removes spare nodes, deletes bound pods and creates new pending ones.
Afterwards every GPU's bound pods are counted against its slots.

Module-level imports stay light: the extender's process imports this module.
"""

from __future__ import annotations

import json
import multiprocessing
import queue
import random
import shutil
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .scheduler_client import START_TIMEOUT_S, VERBS, schedule

if TYPE_CHECKING:
    from tests.harness.fakeapi import FakeApiServer

GPUS, SLOTS = 2, 4
FINISH_TIMEOUT_S = 60.0
"""For the scheduler processes to finish the pod in hand and report once the run is over."""


@dataclass
class Tally:
    """What the clients and the churn saw."""

    latency: dict[str, list[float]] = field(default_factory=lambda: {verb: [] for verb in VERBS})
    statuses: Counter[int] = field(default_factory=Counter)
    bound: list[str] = field(default_factory=list)
    bind_errors: list[str] = field(default_factory=list)
    churn: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def p99_ms(self, verb: str) -> float:
        values = sorted(self.latency[verb])
        return 1000 * values[min(len(values) - 1, int(len(values) * 0.99))] if values else 0.0


def new_pod(name: str, rng: random.Random) -> dict[str, Any]:
    from tests.extender.builders import pod

    return pod(name, memory=rng.choice([None, 8192, 16384, 30000]), duty=rng.choice([None, 20, 40]))


def serve(kubeconfig: str, ports: Any) -> None:
    """The extender in its own process (so the clients do not share its interpreter)."""
    from baton.contract.kube import load_api_client
    from extender.app import create_app
    from extender.bind import Binder
    from extender.cache import KubeCache
    from extender.kubeapi import KubePodApi
    from extender.metrics import Metrics
    from extender.placement import Limits
    from extender.server import ServerThread
    from extender.state import ClusterState

    client = load_api_client(kubeconfig)
    cache = KubeCache(ClusterState(Limits(), time.monotonic), client)
    cache.start()
    if not cache.wait_synced(170):
        return
    binder = Binder(cache, KubePodApi(client), time.time_ns)
    server = ServerThread(create_app(cache, binder, Metrics()), on_stop=binder.close).start()
    ports.put(server.port)
    threading.Event().wait()  # until the parent terminates this process


class ExtenderLoad:
    """The fake API server, the extender serving from it, and the pods created so far."""

    def __init__(
        self, nodes: int, pods: int, seed: int = 3, compact_every_s: float | None = None
    ) -> None:
        from tests.extender.builders import node
        from tests.harness.fakeapi import FakeApiServer

        self.rng = random.Random(seed)
        self.compact_every_s = compact_every_s
        """How often the churn makes the API server forget its watch history (as etcd's
        compaction does), so that the extender relists while binds go on; None: never."""
        self.api: FakeApiServer = FakeApiServer().start()
        for i in range(nodes):
            self.api.put_object(node(f"node-{i:05d}", gpus=GPUS, slots=SLOTS))
        self.node_names = [f"node-{i:05d}" for i in range(nodes)]
        self.pods: list[str] = []
        self.pending: queue.Queue[str] = queue.Queue()
        for _ in range(pods):
            self.add_pending()
        self._workdir = tempfile.mkdtemp(dir="/tmp", prefix="baton-extender-load-")
        kubeconfig = str(self.api.kubeconfig_path(self._workdir))
        spawn = multiprocessing.get_context("spawn")
        ports: Any = spawn.Queue()
        self.server = spawn.Process(target=serve, args=(kubeconfig, ports), daemon=True)
        self.server.start()
        try:
            self.port = int(ports.get(timeout=180))
        except queue.Empty:
            self.close()
            raise AssertionError("the extender did not sync with the API server in 180 s") from None
        self.tally = Tally()

    def add_pending(self) -> None:
        name = f"p-{len(self.pods):06d}"
        self.pods.append(name)
        self.api.put_object(new_pod(name, self.rng))
        self.pending.put(name)

    def close(self) -> None:
        self.server.terminate()
        self.server.join(10)
        self.api.stop()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def run(self, clients: int, seconds: float, pending: int = 0) -> Tally:
        """`clients` scheduler processes for `seconds` (timed from when all are connected), with
        at least `pending` pods waiting when they start; a fresh tally each run."""
        self.tally = Tally()
        while self.pending.qsize() < pending:
            self.add_pending()
        spawn = multiprocessing.get_context("spawn")
        work: Any = spawn.Queue(maxsize=clients)
        events: Any = spawn.Queue()
        go, finish = spawn.Event(), spawn.Event()
        procs = [
            spawn.Process(
                target=schedule,
                args=(self.port, self.node_names, seed, work, events, go, finish),
                name=f"scheduler-{seed}",
                daemon=True,
            )
            for seed in range(clients)
        ]
        stop, gave_up = threading.Event(), threading.Event()
        threads = [
            threading.Thread(target=self._feed, args=(work, stop), name="feeder"),
            threading.Thread(target=self._churn, args=(stop,), name="churn"),
        ]
        for p in procs:
            p.start()
        try:
            self._await(events, "ready", clients, START_TIMEOUT_S)
            go.set()
            for t in threads:
                t.start()
            collector = threading.Thread(
                target=self._collect, args=(events, clients, gave_up), name="collector"
            )
            collector.start()
            stop.wait(seconds)
            finish.set()
            stop.set()
            for t in threads:
                t.join(30)
            collector.join(FINISH_TIMEOUT_S)
            if collector.is_alive():
                raise AssertionError(f"scheduler clients did not report {FINISH_TIMEOUT_S:g} s on")
        finally:
            go.set()
            finish.set()
            stop.set()
            gave_up.set()
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.terminate()
                    p.join(5)
            work.cancel_join_thread()
        return self.tally

    def _await(self, events: Any, kind: str, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for seen in range(count):
            try:
                event = events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"{seen} of {count} scheduler clients {kind} within {timeout_s:g} s"
                ) from None
            if event[0] != kind:
                raise AssertionError(f"a scheduler client said {event!r} before it was {kind}")

    def _collect(self, events: Any, clients: int, gave_up: threading.Event) -> None:
        """Bind outcomes as they come (the churn deletes bound pods), then each client's figures."""
        done = 0
        while done < clients and not gave_up.is_set():
            try:
                kind, *rest = events.get(timeout=0.5)
            except queue.Empty:
                continue
            with self.tally.lock:
                if kind == "bound":
                    self.tally.bound.append(rest[0])
                elif kind == "error":
                    self.tally.bind_errors.append(rest[0])
                elif kind == "done":
                    latency, statuses = rest
                    for verb, values in latency.items():
                        self.tally.latency[verb] += values
                    self.tally.statuses.update(statuses)
                    done += 1

    def _feed(self, work: Any, stop: threading.Event) -> None:
        """Pending pods to the clients, each as the API server has it when handed out."""
        while not stop.is_set():
            try:
                name = self.pending.get(timeout=0.5)
            except queue.Empty:
                continue
            spec = self.api.get_object("Pod", name)
            while spec is not None and not stop.is_set():
                try:
                    work.put((name, spec), timeout=0.5)
                    break
                except queue.Full:
                    continue

    def _churn(self, stop: threading.Event) -> None:
        """Node and pod churn through the API server, as fast as it goes, until stopped."""
        from baton.contract.names import ANNOTATION_GPUS
        from tests.extender.builders import node

        spare = 0
        compact_at = time.monotonic() + (self.compact_every_s or 0)
        while not stop.wait(0.02):  # paced so the churn does not starve the API server
            step = self.rng.randrange(4)
            if self.compact_every_s and time.monotonic() >= compact_at:
                compact_at += self.compact_every_s
                with self.api.atomically():  # a change no watch has seen yet, then forgotten
                    self.add_pending()
                    self.api.compact_history()
                self.tally.churn["watch history compacted"] += 1
            elif step == 0:
                name = self.rng.choice(self.node_names)
                gpus = json.loads(
                    node(name, gpus=GPUS, slots=SLOTS)["metadata"]["annotations"][ANNOTATION_GPUS]
                )
                gpus[self.rng.randrange(GPUS)]["healthy"] = self.rng.random() < 0.5
                self.api.put_object(node(name, gpus=gpus))
                self.tally.churn["node health flipped"] += 1
            elif step == 1:
                spare += 1
                self.api.put_object(node(f"spare-{spare}", gpus=GPUS, slots=SLOTS))
                if spare > 3:
                    self.api.remove_object("Node", f"spare-{spare - 3}", namespace="")
                self.tally.churn["spare node added or removed"] += 1
            elif step == 2 and self.tally.bound:
                with self.tally.lock:
                    gone = self.tally.bound.pop(self.rng.randrange(len(self.tally.bound)))
                self.api.remove_object("Pod", gone)
                self.tally.churn["bound pod deleted"] += 1
            else:
                self.add_pending()
                self.tally.churn["pending pod created"] += 1

    def double_booked(self) -> list[str]:
        """GPUs with more bound pods than slots, according to the API server."""
        from baton.contract.names import ANNOTATION_ASSIGNED_GPUS

        per_gpu: Counter[str] = Counter()
        for name in self.pods:
            obj = self.api.get_object("Pod", name)
            if not obj or not obj["spec"].get("nodeName"):
                continue
            notes = obj["metadata"].get("annotations") or {}
            for gpu in filter(None, notes.get(ANNOTATION_ASSIGNED_GPUS, "").split(",")):
                per_gpu[gpu] += 1
        return [f"{gpu}: {n} pods on {SLOTS} slots" for gpu, n in per_gpu.items() if n > SLOTS]
