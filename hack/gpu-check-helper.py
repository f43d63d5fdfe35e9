"""Helpers for hack/gpu-check.sh, one per subcommand (run with PYTHONPATH at the repo root).

pods KUBECONFIG NODE GPU MIB NAME=UID...  serve a fake API server holding the node and one pod per
                                          tenant (assigned GPU, declared memory); writes its
                                          kubeconfig, then runs until SIGTERM
wait-parked URL TIMEOUT                   wait until /v1/status shows a tenant parked; print it
copy-rate GIB                             host↔device copy GB/s (pinned memory) on GPU 0, as JSON
figures COPY_JSON LOG...                  park/restore GB/s from agent logs against the copy rate
evidence PARKED A_JSON B_JSON LOG...      pass only if the moves the turns required happened
"""

from __future__ import annotations

import itertools
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
                        "resources": {
                            "limits": {"baton.dev/gpu": "1", "baton.dev/gpu-memory": mib}
                        },
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
    moved = {
        direction: [(n, s) for _, n, s in found if n] for direction, found in moves_in(logs).items()
    }

    def gbps(moves: list[tuple[int, float]]) -> float | None:
        seconds = sum(s for _, s in moves)
        return round(sum(b for b, _ in moves) / seconds / 1e9, 2) if seconds else None

    out, into = gbps(moved["park"]), gbps(moved["restore"])
    print(json.dumps({
        "parks": len(moved["park"]), "restores": len(moved["restore"]),
        "out_gbps": out, "in_gbps": into, **copy,
        "out_vs_d2h": round(out / copy["d2h_gbps"], 2) if out and copy.get("d2h_gbps") else None,
        "in_vs_h2d": round(into / copy["h2d_gbps"], 2) if into and copy.get("h2d_gbps") else None,
    }))  # fmt: skip
    return 0


def moves_in(logs: tuple[str, ...]) -> dict[str, list[tuple[str, int, float]]]:
    """Per direction, (tenant, bytes, seconds) of every move the agents' logs report."""
    out: dict[str, list[tuple[str, int, float]]] = {"park": [], "restore": []}
    for log in logs:
        for match in MOVE.finditer(Path(log).read_text()):
            out[match.group(1)].append((match.group(2), int(match.group(4)), float(match.group(5))))
    return out


def evidence(parked: str, a_json: str, b_json: str, *logs: str) -> int:
    """Exit 1 unless every switch between the tenants parked one (they do not fit together),
    each tenant saw its peer parked, and the restarted agent (the last log) restored `parked`."""
    turns = []
    for report in (a_json, b_json):
        data = json.loads(Path(report).read_text())
        turns += [(t["at"], data["tenant"], t["peer"]) for t in data["turns"]]
    order = [name for _, name, _ in sorted(turns)]
    switches = sum(1 for x, y in itertools.pairwise(order) if x != y)
    moved = moves_in(logs)
    parks = [m for m in moved["park"] if m[1] > 0]
    saw_peer = {name: any(peer for _, n, peer in turns if n == name) for name in set(order)}
    restored_after_restart = any(t == parked for t, _, _ in moves_in(logs[-1:])["restore"])
    result = {
        "turns": len(order), "switches": switches, "parks": len(parks),
        "restores": len(moved["restore"]), "saw_peer_parked": saw_peer,
        "restarted_agent_restored": restored_after_restart,
    }  # fmt: skip
    print(json.dumps(result))
    problems = []
    if switches < 2 or len(parks) < switches:
        problems.append(f"{len(parks)} parks for {switches} switches between the tenants")
    problems += [f"{n} never saw its peer parked" for n, saw in saw_peer.items() if not saw]
    if not restored_after_restart:
        problems.append(f"the restarted agent never restored {parked}")
    for problem in problems:
        print(f"gpu-check: {problem}", file=sys.stderr)
    return 1 if problems else 0


def main() -> int:
    commands: dict[str, Callable[..., int]] = {
        "pods": pods, "wait-parked": wait_parked, "copy-rate": copy_rate, "figures": figures,
        "evidence": evidence,
    }  # fmt: skip
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    return commands[sys.argv[1]](*sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
