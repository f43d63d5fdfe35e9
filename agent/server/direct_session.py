"""Direct sessions: the session stream carried on the handshake connection, without gRPC.

The handshake already proved who the client is (SO_PEERCRED); if the client then sends frames
(`baton.contract.framing`), the first is a Hello with its registration and the rest are the
messages of the `Session` RPC. A turn handoff over this link is one small write on each side,
which is what keeps it well under a millisecond.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from agent.core import errors
from agent.node.identity import UNUSED_TOKEN_TTL, Peer
from agent.server import api_ops
from agent.server.grpc_server import AgentServicer
from baton._pb import agent_pb2 as pb
from baton.contract import framing

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = UNUSED_TOKEN_TTL
"""How long a connection may stay open after its token line without saying Hello."""


class FramedLink:
    """The agent's end of a direct session, shaped like the gRPC call `SessionStream` reads."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, limit: int = framing.MAX_FRAME_BYTES) -> pb.ClientMessage | None:
        """The next message; None once the session ended: the peer closed or went away (a
        tenant stopped or killed, its grant unread), or sent what is no frame or a frame over
        `limit` bytes (a warning)."""
        try:
            return await framing.read_frame(self._reader, pb.ClientMessage, limit)
        except (framing.FrameCut, ConnectionError) as exc:
            log.debug("direct session ended as the peer went away: %s", exc)
            return None
        except (framing.FrameError, OSError) as exc:
            log.warning("direct session ended on a bad read: %s", exc)
            return None

    async def write(self, message: pb.AgentMessage) -> None:
        self._writer.write(framing.encode(message))
        if self._writer.transport.get_write_buffer_size():
            await self._writer.drain()

    def write_now(self, message: pb.AgentMessage) -> bool:
        """Write a whole frame without waiting (a grant, in the step that made it); False if
        the socket's buffer is backed up (it is written by `write` instead)."""
        if self._writer.transport.get_write_buffer_size() or self._writer.is_closing():
            return False
        self._writer.write(framing.encode(message))
        return True


async def serve(
    servicer: AgentServicer,
    peer: Peer,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    said: Callable[[], None] = lambda: None,
) -> None:
    """Serve what follows the token line on one handshake connection (nothing, or a session);
    `said` hears when its first frame (or its end) came (`agent.node.identity.OnSession`)."""
    link = FramedLink(reader, writer)
    try:
        first = await asyncio.wait_for(link.read(framing.HELLO_MAX_BYTES), HELLO_TIMEOUT_S)
    except TimeoutError:
        log.info("handshake connection of pid %d idle after its token; closed", peer.pid)
        return
    finally:
        said()
    if first is None:  # a client that came for its token only
        return
    if not first.HasField("hello"):
        kind = first.WhichOneof("kind")
        refusal = errors.InvalidRegistration(f"a direct session starts with Hello, not {kind}")
        await _refuse(link, refusal)
        return
    if first.hello.session_token:
        await _serve_calls(servicer, peer, first.hello.session_token, link)
        return
    try:
        tenant = await servicer.register_peer(peer, first.hello.register)
    except errors.AgentError as exc:
        await _refuse(link, exc)
        return
    await servicer.run_session(peer, tenant, first.hello, link)


async def _serve_calls(servicer: AgentServicer, peer: Peer, token: str, link: FramedLink) -> None:
    """A call link: requests of the session `token` names, from the process that opened it.
    It ends with that session."""
    try:
        tenant = servicer.session_tenant(token, peer.pid)
    except errors.AgentError as exc:
        await _refuse(link, exc)
        return
    calls = asyncio.create_task(servicer.run_calls(tenant, link, peer.pid))
    ended = asyncio.create_task(servicer.session_ended(token).wait())
    try:
        await asyncio.wait((calls, ended), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (calls, ended):
            task.cancel()
        await asyncio.gather(calls, ended, return_exceptions=True)


async def _refuse(link: FramedLink, exc: errors.AgentError) -> None:
    log.info("direct session refused: %s", exc)
    with contextlib.suppress(OSError):
        await link.write(pb.AgentMessage(refused=api_ops.error_status(exc)))
