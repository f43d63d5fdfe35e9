"""A tenant process for tests: the real client, driven by JSON commands on stdin.

    python -m tests.harness.agent_tenant SOCKET NAME GPU[,GPU...]

Commands (one JSON object per line): acquire {timeout, gpus}, yield, rpc {method, lease_id,
gpus} (a raw unary call with this tenant's session token), close (the client's session ends;
the process lives on), exit. Each gets one JSON answer.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import grpc

from agent.client import Baton, BatonError
from baton._pb import agent_pb2 as pb
from baton._pb import agent_pb2_grpc
from baton.contract.names import AGENT_SESSION_METADATA


def answer(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def run_rpc(baton: Baton, command: dict[str, Any]) -> None:
    metadata = ((AGENT_SESSION_METADATA, baton._token),)  # this process's session
    with grpc.insecure_channel(f"unix:{baton.socket}") as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        try:
            if command["method"] == "Yield":
                reply: Any = stub.Yield(
                    pb.YieldRequest(lease_id=command.get("lease_id", "")),
                    metadata=metadata,
                    timeout=10,
                )
            elif command["method"] == "GetLease":
                reply = stub.GetLease(
                    pb.GetLeaseRequest(lease_id=command["lease_id"]), metadata=metadata, timeout=10
                )
            else:
                request = pb.AcquireRequest(
                    gpus=command.get("gpus", []), timeout_ms=command.get("timeout_ms", 0)
                )
                reply = stub.Acquire(request, metadata=metadata, timeout=30)
        except grpc.RpcError as exc:
            answer(ok=False, code=exc.code().name, message=exc.details())
            return
    answer(ok=True, reply=str(reply))


def main() -> None:
    socket, name, gpus = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    baton = Baton(socket, gpus, name=name)
    baton.connect()
    answer(ready=True, pid=os.getpid())
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        try:
            if op == "acquire":
                lease = baton.acquire(command.get("timeout"), command.get("gpus"))
                answer(ok=True, lease_id=lease.lease_id, tokens=lease.fencing_tokens)
            elif op == "yield":
                baton.yield_()
                answer(ok=True)
            elif op == "rpc":
                run_rpc(baton, command)
            elif op == "close":
                baton.close()
                answer(ok=True)
            elif op == "exit":
                baton.close()
                return
        except BatonError as exc:
            answer(ok=False, error=type(exc).__name__, message=str(exc))


if __name__ == "__main__":
    main()
