"""The blocking client's call link: acquire and yield on a connection read by the waiting thread.

A call link joins the client's session by its token (the agent accepts it only from the same
process) and carries one request at a time; the caller's thread writes the request and reads
the answer itself, so no thread hop sits in a turn.
"""

from __future__ import annotations

import contextlib
import socket as socketlib
import time

from agent.client.connect import CLIENT_VERSION
from agent.client.errors import AgentUnavailable, from_status
from agent.client.session_core import SessionCore
from agent.client.types import REPLY_TIMEOUT_S
from agent.wire.handshake import handshake_path, read_token_line
from baton._pb import agent_pb2 as pb
from baton.contract import framing


class NotSent(Exception):
    """The session broke before a request left: it may be sent again after the reconnect."""


class CallLink:
    """A connection that carries this client's requests; read by the thread that waits."""

    def __init__(
        self,
        sock: socketlib.socket,
        reader: framing.BlockingReader,
        token: str,
        agent_socket: str,
        core: SessionCore,
    ):
        self.sock = sock
        self.reader = reader
        self.token = token
        """The session this link belongs to."""
        self.agent_socket = agent_socket
        self._core = core
        """The client's session state: its request ids, and what to do with a stray answer."""
        self.closed = False

    @classmethod
    def open(cls, socket: str, token: str, timeout: float, core: SessionCore) -> CallLink:
        """Join the session `token` on a connection of its own."""
        sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(handshake_path(socket))
            _, rest = read_token_line(sock)
            hello = pb.Hello(client_version=CLIENT_VERSION, session_token=token)
            sock.sendall(framing.encode(pb.ClientMessage(hello=hello)))
            reader = framing.BlockingReader(sock, rest)
            first = reader.read(pb.AgentMessage)
            if first is None or not first.HasField("welcome"):
                why = first.refused.message if first is not None else "closed"
                raise OSError(f"the agent did not open a call link: {why}")
        except BaseException:
            sock.close()
            raise
        return cls(sock, reader, token, socket, core)

    def send(self, message: pb.ClientMessage) -> None:
        self.sock.sendall(framing.encode(message))

    def read(self, timeout: float | None) -> pb.Reply | None:
        """The next reply; None at the end of the link; `TimeoutError` after `timeout`."""
        self.sock.settimeout(timeout)
        message = self.reader.read(pb.AgentMessage)
        if message is None:
            return None
        if not message.HasField("reply"):
            raise framing.FrameError(
                f"a call link carries replies, not {message.WhichOneof('kind')}"
            )
        return message.reply

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socketlib.SHUT_RDWR)
        self.sock.close()

    def call(
        self, request: pb.Request, timeout: float | None, answered: list[pb.Reply] | None = None
    ) -> pb.Reply:
        """Send `request`, wait up to `timeout` for the answer; withdraw an unanswered acquire.
        The answer is put in `answered` as it is read, for a caller interrupted before it
        takes the answer (a turn it grants is then the caller's to give back)."""
        request.request_id = next(self._core.ids)
        kind = request.WhichOneof("kind")
        try:
            self.send(pb.ClientMessage(request=request))
        except OSError:
            self.close()
            raise NotSent from None
        reply = None
        try:
            reply = self._answer(request.request_id, timeout, answered)
        finally:
            if reply is None and kind == "acquire":  # timed out, or interrupted: leave the queue
                self._withdraw(request.request_id)
        if reply is None:
            raise AgentUnavailable(
                f"the Baton agent at {self.agent_socket} did not answer a {kind} request "
                f"within {timeout:.3g} s"
            )
        if reply.HasField("error"):
            raise from_status(reply.error.code, reply.error.message, self.agent_socket)
        return reply

    def _answer(
        self, request_id: int, timeout: float | None, answered: list[pb.Reply] | None = None
    ) -> pb.Reply | None:
        """The reply to `request_id` read from `link` (also put in `answered`); None if
        `timeout` passes first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return None
            try:
                reply = self.read(wait)
            except TimeoutError:
                return None
            except (OSError, framing.FrameError) as exc:
                self.close()
                raise AgentUnavailable(
                    f"lost the Baton agent at {self.agent_socket} ({exc}); "
                    "reconnecting, retry the call"
                ) from None
            if reply is None:
                self.close()
                raise AgentUnavailable(
                    f"lost the Baton agent at {self.agent_socket}; reconnecting, retry the call"
                )
            if reply.request_id == request_id:
                if answered is not None:
                    answered.append(reply)
                return reply
            self._stray(reply)

    def _stray(self, reply: pb.Reply) -> None:
        """An answer nobody waits for: what the core says to do with it (hand a turn back)."""
        release = self._core.unclaimed(reply)
        if release is not None:
            with contextlib.suppress(OSError):
                self.send(pb.ClientMessage(request=release))

    def _withdraw(self, request_id: int) -> None:
        """Take a pending acquire off the queue; a turn granted meanwhile is handed back."""
        cancel = pb.Request(request_id=request_id, cancel=pb.CancelRequest())
        try:
            self.send(pb.ClientMessage(request=cancel))
            reply = self._answer(request_id, REPLY_TIMEOUT_S)
        except (OSError, AgentUnavailable):
            reply = None
        if reply is None:  # closing the link withdraws it too
            self.close()
        else:
            self._stray(reply)
