"""The extender load run: concurrent scheduler clients while the watch delivers churn.

A real extender (cache, binder, HTTP app) runs in its own process, watching the fake API
server. `clients` threads each take pending pods and do what kube-scheduler does (filter,
prioritize, bind the best node); meanwhile a churn thread flips GPU health on nodes, adds and
removes spare nodes, deletes bound pods and creates new pending ones. Afterwards every GPU's
bound pods are counted against its slots.
"""

from __future__ import annotations

import json
import multiprocessing
import queue
import random
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from baton.kube import load_api_client
from baton.names import ANNOTATION_ASSIGNED_GPUS, ANNOTATION_GPUS
from extender.app import create_app
from extender.bind import Binder
from extender.cache import KubeCache
from extender.kubeapi import KubePodApi
from extender.metrics import Metrics
from extender.placement import Limits
from extender.server import ServerThread
from extender.state import ClusterState
from tests.extender.builders import node, pod
from tests.harness.fakeapi import FakeApiServer

GPUS, SLOTS = 2, 4


@dataclass
class Tally:
    """What the clients and the churn saw."""

    latency: dict[str, list[float]] = field(
        default_factory=lambda: {"filter": [], "prioritize": [], "bind": []}
    )
    statuses: Counter[int] = field(default_factory=Counter)
    bound: list[str] = field(default_factory=list)
    bind_errors: list[str] = field(default_factory=list)
    churn: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def p99_ms(self, verb: str) -> float:
        values = sorted(self.latency[verb])
        return 1000 * values[min(len(values) - 1, int(len(values) * 0.99))] if values else 0.0


def new_pod(name: str, rng: random.Random) -> dict[str, Any]:
    return pod(name, memory=rng.choice([None, 8192, 16384, 30000]), duty=rng.choice([None, 20, 40]))


def serve(kubeconfig: str, ports: Any) -> None:
    """The extender in its own process (so the clients do not share its interpreter)."""
    client = load_api_client(kubeconfig)
    cache = KubeCache(ClusterState(Limits(), time.monotonic), client)
    cache.start()
    if not cache.wait_synced(170):
        return
    binder = Binder(cache, KubePodApi(client), time.time_ns)
    server = ServerThread(create_app(cache, binder, Metrics())).start()
    ports.put(server.port)
    threading.Event().wait()  # until the parent terminates this process


class ExtenderLoad:
    """The fake API server, the extender serving from it, and the pods created so far."""

    def __init__(self, nodes: int, pods: int, seed: int = 3) -> None:
        self.rng = random.Random(seed)
        self.api = FakeApiServer().start()
        for i in range(nodes):
            self.api.put_object(node(f"node-{i:05d}", gpus=GPUS, slots=SLOTS))
        self.node_names = [f"node-{i:05d}" for i in range(nodes)]
        self.pods: list[str] = []
        self.pending: queue.Queue[str] = queue.Queue()
        for _ in range(pods):
            self.add_pending()
        kubeconfig = str(self.api.kubeconfig_path(tempfile.mkdtemp(dir="/tmp")))
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

    def run(self, clients: int, seconds: float) -> Tally:
        stop = threading.Event()
        threads = [threading.Thread(target=self._client, args=(stop, i)) for i in range(clients)]
        threads.append(threading.Thread(target=self._churn, args=(stop,)))
        for t in threads:
            t.start()
        stop.wait(seconds)
        stop.set()
        for t in threads:
            t.join(30)
        return self.tally

    def _client(self, stop: threading.Event, seed: int) -> None:
        rng = random.Random(seed)
        url = f"http://127.0.0.1:{self.port}"
        with httpx.Client(base_url=url, timeout=30) as http:
            while not stop.is_set():
                try:
                    name = self.pending.get(timeout=0.5)
                except queue.Empty:
                    continue
                spec = self.api.get_object("Pod", name)
                if spec is None:
                    continue
                names = rng.sample(self.node_names, min(50, len(self.node_names)))
                args = {"Pod": spec, "NodeNames": names, "Nodes": None}
                passed = self._call(http, "filter", args).get("NodeNames") or []
                if not passed:
                    continue
                args["NodeNames"] = passed
                scores = self._call(http, "prioritize", args)
                best = max(scores, key=lambda s: s["Score"])["Host"] if scores else passed[0]
                meta = spec["metadata"]
                bind = {
                    "PodName": name,
                    "PodNamespace": "default",
                    "PodUID": meta["uid"],
                    "Node": best,
                }
                error = self._call(http, "bind", bind).get("Error", "")
                with self.tally.lock:
                    (
                        self.tally.bind_errors.append(error)
                        if error
                        else self.tally.bound.append(name)
                    )

    def _call(self, http: httpx.Client, verb: str, body: Any) -> Any:
        began = time.perf_counter()
        r = http.post(
            f"/{verb}", content=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        with self.tally.lock:
            self.tally.latency[verb].append(time.perf_counter() - began)
            self.tally.statuses[r.status_code] += 1
        return r.json() if r.status_code == 200 else {}

    def _churn(self, stop: threading.Event) -> None:
        """Node and pod churn through the API server, as fast as it goes, until stopped."""
        spare = 0
        while not stop.wait(0.02):  # paced so the churn does not starve the clients
            step = self.rng.randrange(4)
            if step == 0:
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
        per_gpu: Counter[str] = Counter()
        for name in self.pods:
            obj = self.api.get_object("Pod", name)
            if not obj or not obj["spec"].get("nodeName"):
                continue
            notes = obj["metadata"].get("annotations") or {}
            for gpu in filter(None, notes.get(ANNOTATION_ASSIGNED_GPUS, "").split(",")):
                per_gpu[gpu] += 1
        return [f"{gpu}: {n} pods on {SLOTS} slots" for gpu, n in per_gpu.items() if n > SLOTS]
