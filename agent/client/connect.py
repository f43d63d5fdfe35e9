"""Opening a session with the node agent: handshake, registration, the session link."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc

from agent.client.errors import AgentUnavailable, BatonError, from_rpc_error, from_status
from agent.client.links import TRANSPORTS, DirectLink, GrpcLink, SessionLink
from agent.client.refusals import Refusals
from agent.wire.handshake import handshake_path, token_of
from baton._pb import agent_pb2 as pb
from baton._pb import agent_pb2_grpc
from baton.contract.names import AGENT_SESSION_METADATA, ENV_AGENT_SOCKET

log = logging.getLogger("baton.client")

CLIENT_VERSION = "0.1.0"


@dataclass
class Opened:
    """A session the agent welcomed."""

    link: SessionLink
    tenant: pb.Tenant
    token: str
    """The session token: unary RPCs with it as `baton-session` metadata act as this session."""


def _unreachable(socket: str, exc: BaseException | str) -> AgentUnavailable:
    return AgentUnavailable(
        f"cannot reach the Baton agent at {socket} ({exc}); is `baton agent` "
        f"running, and is {ENV_AGENT_SOCKET} right?"
    )


async def _handshake(
    socket: str, timeout: float
) -> tuple[str, asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to the handshake socket next to `socket` and read the token line."""
    # `asyncio.timeout`, not `wait_for`: on Python 3.11 a wait_for whose inner call finishes as
    # it is cancelled (close() during the connect) returns and drops the cancellation, and the
    # close then waits out the next read's whole timeout.
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_unix_connection(handshake_path(socket))
    except TimeoutError:
        raise _unreachable(socket, f"no connection within {timeout:g} s") from None
    except OSError as exc:
        raise _unreachable(socket, exc) from None
    try:
        async with asyncio.timeout(timeout):
            line = await reader.readline()
        return token_of(line), reader, writer
    except TimeoutError:
        writer.close()
        raise _unreachable(socket, f"no handshake line within {timeout:g} s") from None
    except (OSError, ValueError) as exc:
        writer.close()
        raise _unreachable(socket, exc) from None
    except asyncio.CancelledError:  # (close() cut the connect short: the connection goes too)
        writer.close()
        raise


async def session_token(socket: str, timeout: float) -> str:
    """A token from the agent's SO_PEERCRED handshake socket next to `socket`."""
    token, _, writer = await _handshake(socket, timeout)
    writer.close()
    return token


async def open_session(
    socket: str,
    registration: pb.RegisterRequest,
    callbacks: Sequence[str],
    timeout: float,
    transport: str = "direct",
    keeps_turns: bool = False,
) -> Opened:
    """Register and open the session; `AgentUnavailable` (or the refusal) if not."""
    hello = pb.Hello(
        client_version=CLIENT_VERSION, callbacks=sorted(callbacks), keeps_turns=keeps_turns
    )
    if transport == "direct":
        return await _open_direct(socket, registration, hello, timeout)
    if transport == "grpc":
        return await _open_grpc(socket, registration, hello, timeout)
    raise BatonError(f"unknown transport {transport!r}: use one of {', '.join(TRANSPORTS)}")


async def _open_direct(
    socket: str, registration: pb.RegisterRequest, hello: pb.Hello, timeout: float
) -> Opened:
    token, reader, writer = await _handshake(socket, timeout)
    link = DirectLink(reader, writer, socket)
    hello.register.CopyFrom(registration)
    try:
        await link.write(pb.ClientMessage(hello=hello))
        async with asyncio.timeout(timeout):
            welcome = await link.read()
    except (AgentUnavailable, TimeoutError) as exc:
        await link.close()
        raise AgentUnavailable(
            f"the Baton agent at {socket} did not open the session: {exc}"
        ) from None
    except asyncio.CancelledError:  # (close() cut it short: else the agent keeps the session)
        link.cancel()
        raise
    if welcome is not None and welcome.HasField("welcome"):
        return Opened(link, welcome.welcome.tenant, token)
    await link.close()
    if welcome is not None and welcome.HasField("refused"):
        raise from_status(welcome.refused.code, welcome.refused.message, socket)
    raise AgentUnavailable(
        f"the Baton agent at {socket} closed the session before welcoming it; "
        "if it is older than this client, use transport='grpc'"
    )


async def _open_grpc(
    socket: str, registration: pb.RegisterRequest, hello: pb.Hello, timeout: float
) -> Opened:
    token = await session_token(socket, timeout)
    metadata = ((AGENT_SESSION_METADATA, token),)
    channel = grpc.aio.insecure_channel(f"unix:{socket}")
    stub = agent_pb2_grpc.AgentStub(channel)
    call = None
    try:
        reply = await stub.Register(registration, metadata=metadata, timeout=timeout)
        call = stub.Session(metadata=metadata)
        await call.write(pb.ClientMessage(hello=hello))
        async with asyncio.timeout(timeout):
            welcome = await call.read()
        if not isinstance(welcome, pb.AgentMessage):
            raise AgentUnavailable(f"the Baton agent at {socket} closed the session")
    except (grpc.aio.AioRpcError, TimeoutError, AgentUnavailable) as exc:
        if call is not None:
            call.cancel()
        await channel.close()
        if isinstance(exc, grpc.aio.AioRpcError):
            raise _not_opened(exc, socket, timeout) from None
        raise AgentUnavailable(
            f"the Baton agent at {socket} did not open the session: {exc}"
        ) from None
    return Opened(GrpcLink(channel, call, socket), reply.tenant, token)


def _not_opened(exc: grpc.aio.AioRpcError, socket: str, timeout: float) -> BatonError:
    """What a failed `Register` or `Session` says: the agent's refusal, or that its gRPC API
    answered nothing (not an `AcquireTimeout`: no turn was asked for yet)."""
    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return _unreachable(socket, f"its gRPC API answered nothing within {timeout:g} s")
    if exc.code() == grpc.StatusCode.UNAVAILABLE:
        return _unreachable(socket, " ".join((exc.details() or "unavailable").split()))
    return from_rpc_error(exc, socket)


def closed_error() -> BatonError:
    """What a call on a closed `AsyncBaton` raises (and one that close() cut short)."""
    return BatonError("this AsyncBaton client is closed; create a new one")


def ended_error() -> BatonError:
    """What a call on an `AsyncBaton` raises once its session's task was cancelled (as
    `asyncio.run` cancels the tasks left as it returns): the agent took the turn back with it."""
    return BatonError(
        "this AsyncBaton client's session ended with its event loop (its task was cancelled, "
        "as asyncio.run does on return); the agent took its turn back; create a new one"
    )


def lost_error(closing: bool, socket: str) -> BatonError:
    """What the calls waiting for answers on a session that just ended raise (from its task):
    "closed", "ended" if the task was cancelled, else `AgentUnavailable` (it reconnects)."""
    if closing:
        return closed_error()
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        return ended_error()
    return AgentUnavailable(f"lost the Baton agent at {socket}; reconnecting, retry the call")


def usable(closed: bool, session: asyncio.Task[None] | None) -> None:
    """`BatonError` if an `AsyncBaton` cannot serve a call here: it was closed, its session
    runs on another event loop (an earlier `asyncio.run`), or its session's task was cancelled."""
    if closed:
        raise closed_error()
    if session is not None and session.get_loop() is not asyncio.get_running_loop():
        raise BatonError(
            "this AsyncBaton client was connected on another event loop (each asyncio.run() "
            "starts a new one); create a client per event loop"
        )
    if session is not None and session.cancelled():
        raise ended_error()


async def connected(
    is_open: asyncio.Event,
    answered: asyncio.Event,
    refusals: Refusals,
    reconnecting: bool,
    wait: float,
    socket: str,
    closing: Callable[[], bool] = lambda: False,
) -> None:
    """Return once `is_open` is set; `AgentUnavailable` if not within `wait` seconds or if the
    session is broken and no reconnect is under way; the agent's refusal at once if it refuses
    the session for good (`answered` is set then too); the "closed" error if the client is
    `closing` when the wait ends (close() sets `answered` to end it)."""
    if is_open.is_set():
        return
    if (refused := refusals.final()) is not None:
        raise refused
    if not reconnecting:
        raise AgentUnavailable(
            f"lost the Baton agent at {socket} and this client does not reconnect "
            "(reconnect=False); create a new client"
        )
    try:
        await asyncio.wait_for(answered.wait(), max(0.0, wait))
    except TimeoutError:
        usable(closing(), None)
        raise refusals.still_reconnecting(wait) from None
    usable(closing(), None)
    if not is_open.is_set() and (refused := refusals.final()) is not None:
        raise refused


async def reconnect(
    open_: Callable[[], Awaitable[None]],
    closing: Callable[[], bool],
    socket: str,
    heard: Callable[[BatonError], None],
) -> bool:
    """Retry `open_` with backoff until it succeeds (True) or the client closes (False);
    `heard` hears why each try failed."""
    delay = 0.05
    while not closing():
        try:
            await open_()
        except BatonError as exc:
            heard(exc)
            log.warning("reconnect failed (%s); retrying in %.2f s", exc, delay)
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)
            continue
        log.warning("reconnected to the Baton agent at %s", socket)
        return True
    return False
