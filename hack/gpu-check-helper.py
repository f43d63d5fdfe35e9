"""Helpers for hack/gpu-check.sh, one per subcommand (run with PYTHONPATH at the repo root).

pods KUBECONFIG NODE GPU MIB NAME=UID...  serve a fake API server holding the node and one pod per
                                          tenant (assigned GPU, declared memory); writes its
                                          kubeconfig, then runs until SIGTERM
wait-parked URL TIMEOUT                   wait until /v1/status shows a tenant parked; print it
copy-rate GIB                             host↔device copy GB/s (pinned memory) on GPU 0, as JSON
figures COPY_JSON LOG...                  park/restore GB/s from agent logs against the copy rate
"""

from __future__ import annotations

import json
import re
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

MOVE = re.compile(r"\b(park|restore) (\S+) on (\S+): (\d+) bytes in ([\d.]+) s")


def pods(kubeconfig: str, node: str, gpu: str, mib: str, *tenants: str) -> int:
    """Serve the node's pods from a fake API server until SIGTERM."""
    from tests.harness.fakeapi import FakeApiServer

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with FakeApiServer() as api:
        api.put_object({"kind": "Node", "metadata": {"name": node}})
        for tenant in tenants:
            name, uid = tenant.split("=", 1)
            api.put_object({
                "kind": "Pod",
                "metadata": {
                    "name": name, "namespace": "default", "uid": uid,
                    "annotations": {"baton.dev/assigned-gpus": gpu},
                },
                "spec": {
                    "nodeName": node,
                    "containers": [{
                        "name": "trainer", "image": "none",
                        "resources": {"limits": {"baton.dev/gpu-memory": mib}},
                    }],
                },
                "status": {"phase": "Running"},
            })  # fmt: skip
        made = api.kubeconfig_path(Path(kubeconfig).parent)
        Path(kubeconfig).write_text(made.read_text())
        print(f"fake API server on {api.url}", flush=True)
        stop.wait()
    return 0


def wait_parked(url: str, timeout: str) -> int:
    """Poll the agent's status until some tenant is parked; print its id."""
    deadline = time.monotonic() + float(timeout)
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/v1/status", timeout=5) as reply:
                status = json.load(reply)
        except OSError:
            status = {}
        for tenant_id, entry in status.get("residency", {}).get("tenants", {}).items():
            if entry.get("residency") == "parked":
                print(tenant_id, flush=True)
                return 0
        time.sleep(0.2)
    print(f"no tenant was parked within {timeout} s", file=sys.stderr)
    return 1


def copy_rate(gib: str) -> int:
    """GB/s of one pinned host→device and device→host copy of GIB GiB on GPU 0."""
    import torch

    n = int(gib) << 30
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(n, dtype=torch.uint8, device="cuda")
    rates = {}
    for direction in ("h2d", "d2h", "h2d", "d2h"):  # the second of each counts (warm)
        torch.cuda.synchronize()
        start = time.perf_counter()
        if direction == "h2d":
            device.copy_(host, non_blocking=True)
        else:
            host.copy_(device, non_blocking=True)
        torch.cuda.synchronize()
        rates[direction] = n / (time.perf_counter() - start) / 1e9
    print(json.dumps({"h2d_gbps": round(rates["h2d"], 2), "d2h_gbps": round(rates["d2h"], 2)}))
    return 0


def figures(copy_json: str, *logs: str) -> int:
    """Park (out) and restore (in) GB/s from the agents' move log lines, as JSON."""
    copy = json.loads(Path(copy_json).read_text())
    moved: dict[str, list[tuple[int, float]]] = {"park": [], "restore": []}
    for log in logs:
        for match in MOVE.finditer(Path(log).read_text()):
            nbytes, seconds = int(match.group(4)), float(match.group(5))
            if nbytes:
                moved[match.group(1)].append((nbytes, seconds))

    def gbps(moves: list[tuple[int, float]]) -> float | None:
        seconds = sum(s for _, s in moves)
        return round(sum(b for b, _ in moves) / seconds / 1e9, 2) if seconds else None

    out, into = gbps(moved["park"]), gbps(moved["restore"])
    print(json.dumps({
        "parks": len(moved["park"]), "restores": len(moved["restore"]),
        "out_gbps": out, "in_gbps": into, **copy,
        "out_vs_d2h": round(out / copy["d2h_gbps"], 2) if out else None,
        "in_vs_h2d": round(into / copy["h2d_gbps"], 2) if into else None,
    }))  # fmt: skip
    return 0


def main() -> int:
    commands: dict[str, Callable[..., int]] = {
        "pods": pods, "wait-parked": wait_parked, "copy-rate": copy_rate, "figures": figures
    }  # fmt: skip
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    return commands[sys.argv[1]](*sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
