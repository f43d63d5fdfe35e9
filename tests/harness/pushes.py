"""What the agent pushes on a client's session, as its session core takes it in."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from agent.client import AsyncBaton, Baton
from baton._pb import agent_pb2 as pb

T = TypeVar("T")
WAIT_S = 10.0


class Pushes(Generic[T]):
    """The `kind` messages (`AgentMessage`'s oneof) a client takes in, each as `read` makes it."""

    def __init__(
        self, client: Baton | AsyncBaton, kind: str, read: Callable[[pb.AgentMessage], T]
    ) -> None:
        self.seen: list[T] = []
        self._changed = threading.Condition()
        core = client._core
        pushed = core.pushed

        def watch(message: pb.AgentMessage) -> pb.Request | None:
            answer = pushed(message)
            if message.WhichOneof("kind") == kind:
                with self._changed:
                    self.seen.append(read(message))
                    self._changed.notify_all()
            return answer

        core.pushed = watch  # type: ignore[method-assign]

    def wait(self, value: T, latest: bool = False) -> None:
        """Return once one was `value` (with `latest`: the latest one is)."""
        self.wait_for(lambda v: v == value, latest, f"{value}")

    def wait_for(self, match: Callable[[T], bool], latest: bool = False, what: str = "") -> T:
        """The first (with `latest`: the latest) one that `match`es, once there is one."""

        def found() -> T | None:
            if latest:
                return self.seen[-1] if self.seen and match(self.seen[-1]) else None
            return next((v for v in self.seen if match(v)), None)

        with self._changed:
            ok = self._changed.wait_for(lambda: found() is not None, WAIT_S)
            assert ok, f"no push {what or 'that matches'} within {WAIT_S} s; seen: {self.seen}"
            value = found()
        assert value is not None
        return value
