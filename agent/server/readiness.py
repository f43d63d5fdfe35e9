"""Whether the agent can serve tenants now: what its `/readyz` answers (503 with the reason);
and the unix sockets it serves tenants on, claimed at start (never from a live agent) and
removed at stop only while they are its own."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from pathlib import Path

from baton.contract.unixsocket import identity, length_problem

PROBE_TIMEOUT_S = 1.0
"""How long a connect to a socket found at start may take to tell a live one from a stale one."""


class SocketUnusable(Exception):
    """The agent cannot serve on a socket it is given; the message says why and what to pass."""


def claim_sockets(path: str, handshake: str) -> None:
    """Make the directory of the agent's socket `path` and of its `handshake` socket, and remove
    a stale socket there (one nobody accepts on, left by an agent that crashed);
    `SocketUnusable` where `path` is too long to bind (with the names bound for it) or another
    process serves a socket (a second agent on this node), `OSError` when a directory cannot be
    made or a file removed."""
    too_long = length_problem(path, {handshake: f"its handshake socket {handshake}"})
    if too_long:
        raise SocketUnusable(f"{too_long}: pass a shorter --socket (BATON_AGENT_SOCKET)")
    for each in (path, handshake):
        Path(each).parent.mkdir(parents=True, exist_ok=True)
        if _accepting(each):
            raise SocketUnusable(
                f"another process serves the socket {each} (a second agent?): stop it, or pass "
                "another --socket"
            )
        Path(each).unlink(missing_ok=True)


def _accepting(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(PROBE_TIMEOUT_S)
        try:
            probe.connect(path)
        except OSError:  # none there, a stale socket (refused), or no socket at all
            return False
    return True


class Readiness:
    """The agent's readiness: not while it stops, while its journal cannot be written, before
    its pod watch has listed the node's pods once (with a node name), or when a socket tenants
    connect to is gone or replaced."""

    def __init__(self, node_name: str) -> None:
        self._node_name = node_name
        self._sockets: dict[str, tuple[int, int, int]] = {}
        self.stopping: str | None = None
        """Why the agent stops (e.g. `SIGTERM`; "" for a plain stop), or None while it serves."""
        self.pods_listed: Callable[[], bool] | None = None
        """With a node name: whether the pod watch has listed the node's pods once."""
        self.unrecorded: Callable[[], str | None] = lambda: None
        """Why what changes now is not on disk (`StateStore.unrecorded`), or None."""

    def stop(self, reason: str) -> None:
        """The agent stops, for `reason` (the first one named stays)."""
        if not self.stopping:
            self.stopping = reason

    def listening(self, *paths: str) -> None:
        """The agent listens on the unix sockets at `paths` (the files it made there)."""
        for path in paths:
            self._sockets[path] = identity(path)

    def remove_own_sockets(self) -> None:
        """Remove the sockets it made that are still there and still its own: a start refused
        for another agent's socket made none, and a newer agent's stay."""
        for path, made in self._sockets.items():
            if not _socket_problem(path, made):
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def not_ready(self) -> str | None:
        """Why the agent cannot serve tenants now (one line), or None when it can."""
        if self.stopping is not None:
            on = f" on {self.stopping}" if self.stopping else ""
            return (
                f"the agent is stopping{on}: it takes no new sessions; tenants, turns and "
                "parked memory are kept for the next agent"
            )
        unrecorded = self.unrecorded()
        if unrecorded:
            return (
                f"{unrecorded}: turns go on, but an agent restarted now would not know of the "
                "turns granted and the memory parked since; free room in --state-dir"
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


def _socket_problem(path: str, made: tuple[int, int, int]) -> str:
    """What is wrong with the socket the agent made at `path`, or ""."""
    try:
        found = identity(path)
    except FileNotFoundError:
        return "is gone from the filesystem (was it or its directory deleted on the host?)"
    except OSError as exc:
        return f"cannot be checked ({exc.strerror})"
    if found != made:
        return "is no longer the one this agent listens on (another file replaced it)"
    return ""
