"""A process that tries to act on another tenant through the agent socket, under its own UID.

    python -m tests.reliability.intruder SOCKET UID GID NAME GPU VICTIM_NAME VICTIM_LEASE VICTIM_GPU

Imports everything as started, then drops to UID/GID (the interpreter may live where that UID
cannot read), registers as tenant NAME on GPU, and prints one JSON object: for each attempt on
the victim, the gRPC status code the agent answered (or {"connect": "EACCES"} if the socket's
mode kept it out).
"""

from __future__ import annotations

import errno
import json
import os
import sys

import grpc

from agent.wire.handshake import handshake_path, request_token
from baton._pb import agent_pb2 as pb
from baton._pb import agent_pb2_grpc
from baton.names import AGENT_SESSION_METADATA


def code_of(call: object) -> str:
    """The status of a unary call: OK or the code's name."""
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as exc:
        return str(exc.code().name)
    return "OK"


def main() -> None:
    socket, uid, gid, name, gpu, victim, lease, victim_gpu = sys.argv[1:9]
    os.setgroups([])
    os.setgid(int(gid))
    os.setuid(int(uid))
    try:
        token = request_token(handshake_path(socket))
    except PermissionError as exc:
        print(json.dumps({"connect": errno.errorcode.get(exc.errno or 0, str(exc))}), flush=True)
        return
    md = ((AGENT_SESSION_METADATA, token),)
    forged = ((AGENT_SESSION_METADATA, token[::-1]),)
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        me = stub.Register(pb.RegisterRequest(name=name, gpus=[gpu]), metadata=md, timeout=10)
        attempts = {
            "yield": lambda: stub.Yield(pb.YieldRequest(lease_id=lease), metadata=md, timeout=10),
            "renew": lambda: stub.Renew(pb.RenewRequest(lease_id=lease), metadata=md, timeout=10),
            "inspect": lambda: stub.GetLease(
                pb.GetLeaseRequest(lease_id=lease), metadata=md, timeout=10
            ),
            "acquire_its_gpu": lambda: stub.Acquire(
                pb.AcquireRequest(gpus=[victim_gpu], timeout_ms=100), metadata=md, timeout=10
            ),
            "join_its_tenant": lambda: stub.Register(
                pb.RegisterRequest(name=victim, gpus=[victim_gpu]), metadata=md, timeout=10
            ),
            "forged_token": lambda: stub.Yield(
                pb.YieldRequest(lease_id=lease), metadata=forged, timeout=10
            ),
            "no_token": lambda: stub.GetLease(pb.GetLeaseRequest(lease_id=lease), timeout=10),
        }
        codes = {what: code_of(call) for what, call in attempts.items()}
    print(json.dumps({"tenant": me.tenant.tenant_id, "uid": os.getuid(), **codes}), flush=True)


if __name__ == "__main__":
    main()
