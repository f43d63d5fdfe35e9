"""Opening a session with the node agent: handshake token, registration, the session stream."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from agent.client.errors import AgentUnavailable, BatonError, from_rpc_error
from agent.identity import handshake_path
from baton._pb import agent_pb2 as pb
from baton._pb import agent_pb2_grpc
from baton.names import AGENT_SESSION_METADATA, ENV_AGENT_SOCKET

log = logging.getLogger("baton.client")

CLIENT_VERSION = "0.1.0"


@dataclass
class Opened:
    """A session the agent welcomed."""

    channel: grpc.aio.Channel
    stub: agent_pb2_grpc.AgentStub
    call: Any
    tenant: pb.Tenant
    metadata: tuple[tuple[str, str], ...]
    """The session token, as sent with every call."""


async def session_token(socket: str, timeout: float) -> str:
    """A token from the agent's SO_PEERCRED handshake socket next to `socket`."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(handshake_path(socket)), timeout
        )
        line = await asyncio.wait_for(reader.readline(), timeout)
        writer.close()
        return str(json.loads(line)["token"])
    except (OSError, TimeoutError, ValueError, KeyError) as exc:
        raise AgentUnavailable(
            f"cannot reach the Baton agent at {socket} ({exc}); is `baton agent` "
            f"running, and is {ENV_AGENT_SOCKET} right?"
        ) from None


async def open_session(
    socket: str, registration: pb.RegisterRequest, callbacks: Sequence[str], timeout: float
) -> Opened:
    """Register and open the session stream; `AgentUnavailable` (or the refusal) if not."""
    metadata = ((AGENT_SESSION_METADATA, await session_token(socket, timeout)),)
    channel = grpc.aio.insecure_channel(f"unix:{socket}")
    stub = agent_pb2_grpc.AgentStub(channel)
    call = None
    try:
        reply = await stub.Register(registration, metadata=metadata, timeout=timeout)
        call = stub.Session(metadata=metadata)
        hello = pb.Hello(client_version=CLIENT_VERSION, callbacks=sorted(callbacks))
        await call.write(pb.ClientMessage(hello=hello))
        welcome = await asyncio.wait_for(call.read(), timeout)
        if not isinstance(welcome, pb.AgentMessage):
            raise AgentUnavailable(f"the Baton agent at {socket} closed the session")
    except (grpc.aio.AioRpcError, TimeoutError, AgentUnavailable) as exc:
        if call is not None:
            call.cancel()
        await channel.close()
        if isinstance(exc, grpc.aio.AioRpcError):
            raise from_rpc_error(exc, socket) from None
        raise AgentUnavailable(
            f"the Baton agent at {socket} did not open the session: {exc}"
        ) from None
    return Opened(channel, stub, call, reply.tenant, metadata)


async def reconnect(
    open_: Callable[[], Awaitable[None]], closing: Callable[[], bool], socket: str
) -> bool:
    """Retry `open_` with backoff until it succeeds (True) or the client closes (False)."""
    delay = 0.05
    while not closing():
        try:
            await open_()
        except BatonError as exc:
            log.warning("reconnect failed (%s); retrying in %.2f s", exc, delay)
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)
            continue
        log.warning("reconnected to the Baton agent at %s", socket)
        return True
    return False
