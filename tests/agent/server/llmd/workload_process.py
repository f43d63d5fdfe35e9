"""A workload in its own process: registers its WorkloadChannel, answers every command, and lives
until the test closes its stdin or kills it."""

from __future__ import annotations

import sys

from tests.agent.server.llmd.llmd_client import register_workload

if __name__ == "__main__":
    target, job, group = sys.argv[1:4]
    workload = register_workload(target, job, group)
    sys.stdin.read()
    workload.close()
