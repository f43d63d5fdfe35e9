"""One scheduler client of the extender load run (`extender_load.py`), in a process of its own.

It does what kube-scheduler does for each pending pod handed to it (filter, prioritize, bind the
best node), timing every HTTP call. It stands in for a scheduler on another machine, so it stays
lean and niced: on this machine's cores the extender it times comes first.

Module-level imports stay light: each scheduler process imports this module.
"""

from __future__ import annotations

import queue
import random
import socket
import time
from collections import Counter
from typing import Any

VERBS = ("filter", "prioritize", "bind")
START_TIMEOUT_S = 120.0
"""For the scheduler processes to start and connect (20 interpreters on 2 cores)."""
IDLE_RECONNECT_S = 2.0
"""A connection idle this long is opened afresh (as a client would after a pause)."""
NO_ANSWER = 0
"""The status counted for a call that got no HTTP answer at all."""
CLIENT_NICE = 10
"""Niceness of the scheduler processes: they stand in for kube-schedulers on other machines,
so on this one the extender they measure is served first whenever both are ready to run."""


def schedule(
    port: int, node_names: list[str], seed: int, work: Any, events: Any, go: Any, finish: Any
) -> None:
    """One scheduler client, in a process of its own: filter, prioritize and bind pending pods.

    It reports `("ready",)` once connected, each bind's outcome as it comes, and its latencies
    and statuses (`("done", latency, statuses)`) when the run is over or it fails.
    """
    import os

    os.nice(CLIENT_NICE)
    client = None
    try:
        client = _Scheduler(port, random.Random(seed), node_names)
        events.put(("ready",))
        if go.wait(START_TIMEOUT_S):
            while not finish.is_set():
                try:
                    name, spec = work.get(timeout=0.5)
                except queue.Empty:
                    continue
                outcome = client.schedule(name, spec)
                if outcome is not None:
                    events.put(outcome)
    finally:
        if client is None:
            events.put(("done", {}, {}))
        else:
            client.close()
            events.put(("done", client.latency, dict(client.statuses)))


class _Scheduler:
    """What one kube-scheduler does for a pod, over one keep-alive connection like Go's client.

    The client is lean (orjson, one request per write, the answer read by its Content-Length)
    because it shares the machine's cores with the extender it measures: http.client and json
    cost each call more CPU than the extender spends answering it."""

    def __init__(self, port: int, rng: random.Random, node_names: list[str]) -> None:
        self.port = port
        self.rng = rng
        self.node_names = node_names
        self.latency: dict[str, list[float]] = {verb: [] for verb in VERBS}
        self.statuses: Counter[int] = Counter()
        self.sock = self._connect()
        self.buffer = b""
        self.used = time.monotonic()

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _reconnect(self) -> None:
        self.sock.close()
        self.sock = self._connect()
        self.buffer = b""

    def close(self) -> None:
        self.sock.close()

    def schedule(self, name: str, spec: dict[str, Any]) -> tuple[str, str] | None:
        """Filter, prioritize and bind one pod; the bind's outcome, None when nothing passed."""
        names = self.rng.sample(self.node_names, min(50, len(self.node_names)))
        args = {"Pod": spec, "NodeNames": names, "Nodes": None}
        passed = self._call("filter", args).get("NodeNames") or []
        if not passed:
            return None
        args["NodeNames"] = passed
        scores = self._call("prioritize", args) or []
        best = max(scores, key=lambda s: s["Score"])["Host"] if scores else passed[0]
        meta = spec["metadata"]
        bind = {"PodName": name, "PodNamespace": "default", "PodUID": meta["uid"], "Node": best}
        error = self._call("bind", bind).get("Error", "")
        return ("error", error) if error else ("bound", name)

    def _call(self, verb: str, body: Any) -> Any:
        """POST the verb, timed around the HTTP exchange alone; the answer, {} unless 200."""
        import orjson

        data = orjson.dumps(body)
        head = f"POST /{verb} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        request = f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data
        if time.monotonic() - self.used > IDLE_RECONNECT_S:
            self._reconnect()
        began = time.perf_counter()
        try:
            self.sock.sendall(request)
            status, answer, close = self._response()
        except (OSError, ValueError):
            self._reconnect()
            answer, status, close = b"", NO_ANSWER, False
        self.latency[verb].append(time.perf_counter() - began)
        self.statuses[status] += 1
        if close:
            self._reconnect()
        self.used = time.monotonic()
        return orjson.loads(answer) if status == 200 else {}

    def _response(self) -> tuple[int, bytes, bool]:
        """Status, body and whether the server closes, read by the answer's Content-Length."""
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self._recv()
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        size = int(fields["content-length"])
        while len(rest) < size:
            rest += self._recv()
        self.buffer = rest[size:]
        return status, rest[:size], fields.get("connection") == "close"

    def _recv(self) -> bytes:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the extender closed the connection")
        return chunk
