"""A job in its own process: acquires a group's turn, says so, then holds it until killed."""

from __future__ import annotations

import sys

from tests.agent.server.llmd.llmd_client import TimeSliceOrchestratorClient

if __name__ == "__main__":
    target, job, group = sys.argv[1:4]
    client = TimeSliceOrchestratorClient(target, job, group)
    ok, _, _ = client.acquire(timeout_sec=20)
    print("held" if ok else "refused", flush=True)
    sys.stdin.read()  # until the test closes stdin or kills us
