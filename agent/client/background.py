"""A request the blocking client sends on its session, answered on the reader thread."""

from __future__ import annotations

from collections.abc import Callable

from agent.client.errors import BatonError, from_status
from baton._pb import agent_pb2 as pb


class BackgroundCall:
    """A request on the session whose answer `on_done` handles on the reader thread."""

    def __init__(self, on_done: Callable[[BackgroundCall], None]) -> None:
        self.reply: pb.Reply | None = None
        self.error: BatonError | None = None
        self.on_done = on_done

    def finish(self, reply: pb.Reply | None, error: BatonError | None = None) -> None:
        self.reply, self.error = reply, error
        self.on_done(self)

    def result(self, socket: str) -> pb.Reply:
        """The reply, or the error it carries."""
        if self.error is not None:
            raise self.error
        assert self.reply is not None
        if self.reply.HasField("error"):
            raise from_status(self.reply.error.code, self.reply.error.message, socket)
        return self.reply
