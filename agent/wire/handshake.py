"""The handshake socket's client side: where it is, and the token line it answers with.

A tenant first connects to a sibling of the agent's socket (`<agent socket>.auth`); the agent
reads the peer's credentials from the kernel and answers with one JSON line carrying a session
token (`agent.node.identity` is the server side).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

from baton.contract.names import (
    AGENT_SESSION_METADATA,
    AGENT_WATCH_METADATA,
    AGENT_WATCH_TOKEN_FILE,
)


def handshake_path(agent_socket: str) -> str:
    """The handshake socket next to the agent's gRPC socket."""
    return f"{agent_socket}.auth"


def session_metadata(agent_socket: str, timeout: float = 5.0) -> tuple[tuple[str, str], ...]:
    """gRPC metadata carrying a fresh handshake token (blocking)."""
    token = request_token(handshake_path(agent_socket), timeout)
    return ((AGENT_SESSION_METADATA, token),)


class WatchTokenUnreadable(OSError):
    """The agent's watch token file cannot be read by this process."""


def watch_metadata(
    agent_socket: str, state_dir: str, timeout: float = 5.0
) -> tuple[tuple[str, str], ...]:
    """Metadata for `WatchEvents`: a handshake token and the agent's watch token (blocking)."""
    path = Path(state_dir) / AGENT_WATCH_TOKEN_FILE
    try:
        watch = path.read_text().strip()
    except OSError as exc:
        raise WatchTokenUnreadable(
            f"cannot read the agent's watch token {path} ({exc.strerror}): watching needs the "
            "agent's user or root on the node (in Kubernetes: in the agent's container); "
            "--state-dir names the agent's state directory"
        ) from None
    return (*session_metadata(agent_socket, timeout), (AGENT_WATCH_METADATA, watch))


def request_token(path: str, timeout: float = 5.0) -> str:
    """Client side of the handshake (blocking)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        return read_token_line(sock)[0]


MAX_TOKEN_LINE = 4096
"""The longest handshake line read (the agent's is under 100 bytes): a peer that sends more
without a newline is not the agent."""


def token_of(line: bytes) -> str:
    """The token in the handshake's line; `ValueError` naming what came if it is not the
    agent's answer (another program on the socket)."""
    try:
        answer = json.loads(line)
    except ValueError:
        answer = None
    token = answer.get("token") if isinstance(answer, dict) else None
    if not isinstance(token, str) or not token:
        raise ValueError(f"not a Baton agent's handshake: {line[:60]!r}")
    return token


def read_token_line(sock: socket.socket) -> tuple[str, bytes]:
    """The handshake's token (blocking), and whatever arrived after its line; `ValueError` if
    what came is not the agent's answer, `OSError` if the socket closed first."""
    data = b""
    while b"\n" not in data:
        if len(data) > MAX_TOKEN_LINE:
            raise ValueError(f"not a Baton agent's handshake: {data[:60]!r}... with no line end")
        chunk = sock.recv(4096)
        if not chunk:
            raise OSError("the handshake socket closed before sending a token")
        data += chunk
    line, _, rest = data.partition(b"\n")
    return token_of(line), rest
