"""Frames of the direct session: a 4-byte big-endian length, then one serialized message.

Both ends of the handshake socket use this once the token line is written (see the comment at
the top of `proto/baton/agent/v1/agent.proto`).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

HEADER = struct.Struct("!I")
MAX_FRAME_BYTES = 4 * 1024 * 1024
"""Larger frames are refused: no message of the protocol comes near this."""

M = TypeVar("M", bound=Message)


class FrameError(Exception):
    """The peer sent something that is not a frame of this protocol."""


def encode(message: Message) -> bytes:
    """One frame holding `message`."""
    body = message.SerializeToString()
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError(f"a {type(message).__name__} of {len(body)} bytes is over the frame limit")
    return frame(body)


def frame(body: bytes) -> bytes:
    """One frame holding `body` as it is."""
    return HEADER.pack(len(body)) + body


def decode(kind: type[M], body: bytes) -> M:
    """The message in a frame's body; `FrameError` if it does not parse as `kind`."""
    message = kind()
    try:
        message.ParseFromString(body)
    except DecodeError as exc:
        raise FrameError(f"a frame is not a {kind.__name__}: {exc}") from None
    return message


async def read_frame(reader: asyncio.StreamReader, kind: type[M]) -> M | None:
    """The next message; None when the peer closed between frames; `FrameError` otherwise."""
    body = await read_body(reader)
    return None if body is None else decode(kind, body)


async def read_body(reader: asyncio.StreamReader) -> bytes | None:
    """The next frame's body, undecoded; None when the peer closed between frames."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise FrameError("the connection ended inside a frame header") from None
        return None
    (size,) = HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise FrameError(f"a frame of {size} bytes is over the limit of {MAX_FRAME_BYTES}")
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise FrameError(f"the connection ended inside a frame of {size} bytes") from None


class BlockingReader:
    """Frames from a blocking socket (the blocking client's reader thread)."""

    def __init__(self, sock: socket.socket, buffered: bytes = b"") -> None:
        self._sock = sock
        self._buffer = bytearray(buffered)

    def read(self, kind: type[M]) -> M | None:
        """The next message; None when the peer closed between frames; `FrameError` otherwise.

        `TimeoutError` when the socket's timeout passes first; no bytes are lost then.
        """
        body = self.read_body()
        return None if body is None else decode(kind, body)

    def read_body(self) -> bytes | None:
        """The next frame's body, undecoded (as `read`)."""
        if not self._fill(HEADER.size):
            return None
        (size,) = HEADER.unpack_from(self._buffer)
        if size > MAX_FRAME_BYTES:
            raise FrameError(f"a frame of {size} bytes is over the limit of {MAX_FRAME_BYTES}")
        if not self._fill(HEADER.size + size):
            raise FrameError(f"the connection ended inside a frame of {size} bytes")
        body = bytes(self._buffer[HEADER.size : HEADER.size + size])
        del self._buffer[: HEADER.size + size]
        return body

    def _fill(self, n: int) -> bool:
        while len(self._buffer) < n:
            chunk = self._sock.recv(max(65536, n - len(self._buffer)))
            if not chunk:
                if self._buffer:
                    raise FrameError("the connection ended inside a frame")
                return False
            self._buffer += chunk
        return True
