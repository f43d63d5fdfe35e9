"""Whether the agent can serve tenants now: what its `/readyz` answers (503 with the reason)."""

from __future__ import annotations

import os
from collections.abc import Callable


class Readiness:
    """The agent's readiness: not while it stops, before its pod watch has listed the node's
    pods once (with a node name), or when a socket tenants connect to is gone or replaced."""

    def __init__(self, node_name: str) -> None:
        self._node_name = node_name
        self._sockets: dict[str, tuple[int, int]] = {}
        self.stopping: str | None = None
        """Why the agent stops (e.g. `SIGTERM`; "" for a plain stop), or None while it serves."""
        self.pods_listed: Callable[[], bool] | None = None
        """With a node name: whether the pod watch has listed the node's pods once."""

    def stop(self, reason: str) -> None:
        """The agent stops, for `reason` (the first one named stays)."""
        if not self.stopping:
            self.stopping = reason

    def listening(self, *paths: str) -> None:
        """The agent listens on the unix sockets at `paths` (the files it made there)."""
        for path in paths:
            info = os.stat(path)
            self._sockets[path] = (info.st_dev, info.st_ino)

    def not_ready(self) -> str | None:
        """Why the agent cannot serve tenants now (one line), or None when it can."""
        if self.stopping is not None:
            on = f" on {self.stopping}" if self.stopping else ""
            return (
                f"the agent is stopping{on}: it takes no new sessions; tenants, turns and "
                "parked memory are kept for the next agent"
            )
        if self.pods_listed is not None and not self.pods_listed():
            return (
                f"node {self._node_name}'s pods are not listed yet (the API server has not "
                "answered the pod watch): a tenant in a pod cannot be identified until they are"
            )
        for path, made in self._sockets.items():
            problem = _socket_problem(path, made)
            if problem:
                return (
                    f"the socket {path} {problem}: tenants cannot connect; restart the agent "
                    "to listen there again"
                )
        return None


def _socket_problem(path: str, made: tuple[int, int]) -> str:
    """What is wrong with the socket the agent made at `path`, or ""."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return "is gone from the filesystem (was it or its directory deleted on the host?)"
    except OSError as exc:
        return f"cannot be checked ({exc.strerror})"
    if (info.st_dev, info.st_ino) != made:
        return "is no longer the one this agent listens on (another file replaced it)"
    return ""
