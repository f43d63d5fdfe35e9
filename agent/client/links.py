"""The two ways a client's session reaches the agent, behind one small interface.

- `DirectLink` (the default): frames on the handshake connection (`baton.contract.framing`),
  read and written by the client's event loop; no gRPC in the turn path.
- `GrpcLink`: the `Session` RPC on the agent's gRPC socket, for comparison and for agents that
  predate direct sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol

import grpc

from agent.client.errors import AgentUnavailable
from baton._pb import agent_pb2 as pb
from baton.contract import framing

TRANSPORTS = ("direct", "grpc")


class SessionLink(Protocol):
    """An open session: messages both ways until either side ends it."""

    async def read(self) -> pb.AgentMessage | None:
        """The next message; None once the session has ended (never raises)."""
        ...

    async def write(self, message: pb.ClientMessage) -> None:
        """Send one message; `AgentUnavailable` if the session has ended."""
        ...

    def cancel(self) -> None:
        """End the session now; a pending `read` returns None."""
        ...

    async def close(self) -> None:
        """End the session and release what it holds."""
        ...


class DirectLink:
    """A direct session on the handshake connection."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, socket: str
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._socket = socket

    async def read(self) -> pb.AgentMessage | None:
        try:
            return await framing.read_frame(self._reader, pb.AgentMessage)
        except (framing.FrameError, OSError):
            return None

    async def write(self, message: pb.ClientMessage) -> None:
        if self._writer.is_closing():
            raise AgentUnavailable(f"lost the Baton agent at {self._socket}: session closed")
        try:
            self._writer.write(framing.encode(message))
            if self._writer.transport.get_write_buffer_size():
                await self._writer.drain()
        except OSError as exc:
            raise AgentUnavailable(f"lost the Baton agent at {self._socket}: {exc}") from None

    def cancel(self) -> None:
        self._writer.close()

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


class GrpcLink:
    """The `Session` RPC on a gRPC channel of its own."""

    def __init__(self, channel: grpc.aio.Channel, call: Any, socket: str) -> None:
        self._channel = channel
        self._call = call
        self._socket = socket

    async def read(self) -> pb.AgentMessage | None:
        try:
            message = await self._call.read()
        except grpc.aio.AioRpcError:
            return None
        except asyncio.CancelledError:  # the call cancelled (`cancel`), or the reading task
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # (its loop ends, close()): it ends
                raise
            return None
        return message if isinstance(message, pb.AgentMessage) else None

    async def write(self, message: pb.ClientMessage) -> None:
        try:
            await self._call.write(message)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            raise AgentUnavailable(f"lost the Baton agent at {self._socket}: {exc}") from None

    def cancel(self) -> None:
        self._call.cancel()

    async def close(self) -> None:
        self._call.cancel()
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(self._call.code(), 1)  # so nothing of the call stays pending
        await self._channel.close()
