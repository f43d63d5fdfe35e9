"""A process that tries to act on another tenant through the agent socket, under its own UID.

    python -m tests.reliability.intruder SOCKET UID GID NAME GPU VICTIM_NAME VICTIM_LEASE VICTIM_GPU

Waits for a line on stdin (the test may first place it in a pod's cgroup), imports everything
it will use, then drops to UID/GID (the checkout and its virtual
environment may live where that UID cannot read, as in a private home or `mktemp -d`),
registers as tenant NAME on GPU, and prints one JSON object: for each attempt on the victim, the
gRPC status code the agent answered (or {"connect": "EACCES"} if the socket's mode kept it out).
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
from baton.contract.names import AGENT_SESSION_METADATA, AGENT_WATCH_METADATA


def code_of(call: object) -> str:
    """The status of a call (a unary call, or the first message of a stream): OK or the code."""
    try:
        answer = call()  # type: ignore[operator]
        if hasattr(answer, "__next__"):
            try:
                next(answer)
            finally:
                answer.cancel()
    except grpc.RpcError as exc:
        return str(exc.code().name)
    return "OK"


def registered_as(stub: agent_pb2_grpc.AgentStub, name: str, gpu: str, md: object) -> str:
    """The tenant a Register as `name` on `gpu` made this process, or the code it was refused."""
    try:
        answer = stub.Register(pb.RegisterRequest(name=name, gpus=[gpu]), metadata=md, timeout=10)
    except grpc.RpcError as exc:
        return str(exc.code().name)
    return str(answer.tenant.tenant_id)


def load_lazy_modules() -> None:
    """Import what grpc and json load on first use, while the interpreter's files are readable:
    a channel (it connects only when called) and a JSON round trip."""
    grpc.insecure_channel("unix:/nonexistent").close()
    json.loads(json.dumps({"loaded": True}))


def drop_to(uid: int, gid: int) -> None:
    """Load what is still to be imported, then become `uid`:`gid` with no other groups."""
    load_lazy_modules()
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def main() -> None:
    socket, uid, gid, name, gpu, victim, lease, victim_gpu = sys.argv[1:9]
    sys.stdin.readline()
    drop_to(int(uid), int(gid))
    try:
        token = request_token(handshake_path(socket))
    except PermissionError as exc:
        print(json.dumps({"connect": errno.errorcode.get(exc.errno or 0, str(exc))}), flush=True)
        return
    md = ((AGENT_SESSION_METADATA, token),)
    forged = ((AGENT_SESSION_METADATA, token[::-1]),)
    guessed_watch = (*md, (AGENT_WATCH_METADATA, "0" * 64))
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        me = registered_as(stub, name, gpu, md)
        attempts = {
            "yield": lambda: stub.Yield(pb.YieldRequest(lease_id=lease), metadata=md, timeout=10),
            "renew": lambda: stub.Renew(pb.RenewRequest(lease_id=lease), metadata=md, timeout=10),
            "inspect": lambda: stub.GetLease(
                pb.GetLeaseRequest(lease_id=lease), metadata=md, timeout=10
            ),
            "acquire_its_gpu": lambda: stub.Acquire(
                pb.AcquireRequest(gpus=[victim_gpu], timeout_ms=100), metadata=md, timeout=10
            ),
            "forged_token": lambda: stub.Yield(
                pb.YieldRequest(lease_id=lease), metadata=forged, timeout=10
            ),
            "no_token": lambda: stub.GetLease(pb.GetLeaseRequest(lease_id=lease), timeout=10),
            "watch": lambda: stub.WatchEvents(pb.WatchEventsRequest(), metadata=md, timeout=10),
            "watch_guessed_token": lambda: stub.WatchEvents(
                pb.WatchEventsRequest(), metadata=guessed_watch, timeout=10
            ),
        }
        codes = {what: code_of(call) for what, call in attempts.items()}
        codes["join_its_tenant"] = registered_as(stub, victim, victim_gpu, md)
    print(json.dumps({"tenant": me, "uid": os.getuid(), **codes}), flush=True)


if __name__ == "__main__":
    main()
