"""Frames: a 4-byte big-endian length, then one serialized message.

The direct session between a tenant and its agent (both ends of the handshake socket, once the
token line is written: the top of `proto/baton/agent/v1/agent.proto`) and the coordinator's
connection to each agent's job turns (the top of `proto/baton/coordinator/v1/jobturns.proto`).
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
HELLO_MAX_BYTES = 64 * 1024
"""The largest first frame a server reads from a peer not yet known (a Hello: a registration,
or a token and a name, is far smaller): such a peer may not make it hold a whole call's frame
for each connection it opens."""

GRPC_PREFACE = b"PRI "
"""How an HTTP/2 (gRPC) client's first bytes begin: named as such rather than as a huge frame."""

M = TypeVar("M", bound=Message)


class FrameError(Exception):
    """The peer sent something that is not a frame of this protocol."""


class FrameTooLarge(FrameError):
    """A frame's header announces more bytes than the reader takes: refused before its body."""


class FrameCut(FrameError):
    """The connection ended inside a frame: the peer went away as it wrote, nothing malformed."""


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


async def read_frame(
    reader: asyncio.StreamReader, kind: type[M], limit: int = MAX_FRAME_BYTES
) -> M | None:
    """The next message; None when the peer closed between frames; `FrameError` otherwise
    (`FrameTooLarge` for a frame over `limit` bytes, refused before its body is read)."""
    body = await read_body(reader, limit)
    return None if body is None else decode(kind, body)


async def read_body(reader: asyncio.StreamReader, limit: int = MAX_FRAME_BYTES) -> bytes | None:
    """The next frame's body, undecoded; None when the peer closed between frames; `FrameCut`
    when it closed inside one, `FrameTooLarge` over `limit` bytes, `FrameError` for what is no
    frame."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise FrameCut("the connection ended inside a frame header") from None
        return None
    if header == GRPC_PREFACE:
        raise FrameError("the peer speaks gRPC (HTTP/2), not frames")
    (size,) = HEADER.unpack(header)
    if size > limit:
        raise FrameTooLarge(f"a frame of {size} bytes is over the limit of {limit}")
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise FrameCut(f"the connection ended inside a frame of {size} bytes") from None


class BlockingReader:
    """Frames from a blocking socket (the blocking client's reader thread)."""

    def __init__(self, sock: socket.socket, buffered: bytes = b"") -> None:
        self._sock = sock
        self._buffer = bytearray(buffered)

    def read(self, kind: type[M]) -> M | None:
        """The next message; None when the peer closed between frames; `FrameCut` inside one,
        `FrameError` for what is no frame.

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
            raise FrameCut(f"the connection ended inside a frame of {size} bytes")
        body = bytes(self._buffer[HEADER.size : HEADER.size + size])
        del self._buffer[: HEADER.size + size]
        return body

    def _fill(self, n: int) -> bool:
        while len(self._buffer) < n:
            chunk = self._sock.recv(max(65536, n - len(self._buffer)))
            if not chunk:
                if self._buffer:
                    raise FrameCut("the connection ended inside a frame")
                return False
            self._buffer += chunk
        return True


class Corked:
    """Frames written in one turn of the event loop leave together, in one `write` at its end:
    one system call and one wake-up of the reader for a release and the prepare behind it."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        """Queue `data` (whole frames) for the end of this turn of the loop."""
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append(data)

    def write_now(self, data: bytes) -> None:
        """Write `data` at once, behind what this turn of the loop queued before it."""
        self._pending.append(data)
        self._flush()

    def _flush(self) -> None:
        if not self._pending:  # written at once meanwhile
            return
        data, self._pending = b"".join(self._pending), []
        if not self._writer.is_closing():
            self._writer.write(data)


KEEPALIVE_IDLE_S = 10
"""A quiet connection is probed after this long, then every `KEEPALIVE_INTERVAL_S`; Linux
ends it once a probe or a frame has gone unacknowledged for `UNACKED_TIMEOUT_S` (a peer's
machine gone, not only its process), so within about 25 s of its peer vanishing."""
KEEPALIVE_INTERVAL_S = 5
UNACKED_TIMEOUT_S = 20


def keep_alive(writer: asyncio.StreamWriter) -> None:
    """Make a TCP connection notice a peer that vanished without closing it (its node powered
    off, a network cut), so the calls on it fail and the next one connects again."""
    sock = writer.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", 3),
        ("TCP_USER_TIMEOUT", UNACKED_TIMEOUT_S * 1000),
    ):
        option = getattr(socket, name, None)
        if option is not None:  # Linux has them all
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
