"""A short-lived caller of llm-d's API that never joins a job (a status poller): it lists the
groups over `count` connections of its own, one after another, then exits."""

from __future__ import annotations

import sys

import grpc

from baton._pb import timeslice_orchestrator_pb2 as ts
from baton._pb import timeslice_orchestrator_pb2_grpc as ts_grpc

if __name__ == "__main__":
    target, count = sys.argv[1], int(sys.argv[2])
    for _ in range(count):  # a local subchannel pool: each channel is a connection of its own
        with grpc.insecure_channel(target, [("grpc.use_local_subchannel_pool", 1)]) as channel:
            ts_grpc.TimeSliceOrchestratorServiceStub(channel).ListGroups(
                ts.ListGroupsRequest(), timeout=10
            )
