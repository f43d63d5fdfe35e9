"""Who is calling: SO_PEERCRED on a handshake socket, session tokens, and PID → pod UID.

gRPC in Python does not expose a unix-socket peer's credentials, so a tenant first connects to
a sibling socket (`<agent socket>.auth`); the agent reads the peer's PID, UID and GID from the
kernel and answers with an unguessable token. The client sends the token as metadata on every
call; it dies with the tenant's session.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)
_CONTAINER_ID = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?$")
UNUSED_TOKEN_TTL = 30.0
"""Seconds a token may go without a session before it is dropped."""


def user_delegated(path: str) -> bool:
    """Whether a cgroup path lies under `user.slice`, where systemd delegates each user's own
    cgroups to that user (`user@UID.service`): any local user may make one there named like a
    pod's (`.../kubepods-pod<UID>.slice`) and move its processes in, so it names no pod. Read
    from a cgroup namespace, the path may start with `/..` components."""
    parts = [part for part in path.strip().split("/") if part not in ("", "..")]
    return bool(parts) and parts[0] == "user.slice"


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID in a `/proc/<pid>/cgroup` file (cgroup v1 or v2, cgroupfs or systemd)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if "kubepods" not in path or user_delegated(path):
            continue
        match = _POD_UID.search(path)
        if match:
            return match.group(1).replace("_", "-")
    return None


def pod_uid_of_pid(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The pod UID of a process, or None outside Kubernetes (or if the process is gone)."""
    try:
        return pod_uid_from_cgroup((proc / str(pid) / "cgroup").read_text())
    except OSError:
        return None


def container_id_from_cgroup(text: str) -> str | None:
    """The container ID in a `/proc/<pid>/cgroup` file of a pod's process (None outside one).

    The last path element under `kubepods`: `cri-containerd-<id>.scope`, `crio-<id>.scope`,
    `docker-<id>.scope` (systemd driver) or `<id>` (cgroupfs driver).
    """
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip()
        if "kubepods" in path and not user_delegated(path):
            match = _CONTAINER_ID.search(path)
            if match:
                return match.group(1)
    return None


def container_id_of_pid(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The container ID of a process in a pod, or None (outside a pod, or gone)."""
    try:
        return container_id_from_cgroup((proc / str(pid) / "cgroup").read_text())
    except OSError:
        return None


@dataclass(frozen=True)
class Peer:
    """A process the kernel vouched for."""

    pid: int
    uid: int
    gid: int
    token: str
    pod_uid: str | None = None
    """The pod its process ran in as it connected, read then: its PID may later be another
    process's (of another pod), while the token lives on."""


class TokenRegistry:
    """Issues session tokens and resolves them to peers."""

    def __init__(self, loop_call_later: Callable[[float, Callable[[], None]], object]) -> None:
        self._peers: dict[str, Peer] = {}
        self._attached: set[str] = set()
        self._tenant_of: dict[str, str] = {}
        self._ended: dict[str, asyncio.Event] = {}
        self._call_later = loop_call_later

    def issue(self, pid: int, uid: int, gid: int, pod_uid: str | None = None) -> Peer:
        """A new token for a process (in the pod `pod_uid`); dropped unless a session attaches
        it in time."""
        token = secrets.token_urlsafe(24)
        peer = Peer(pid=pid, uid=uid, gid=gid, token=token, pod_uid=pod_uid)
        self._peers[peer.token] = peer
        self._call_later(UNUSED_TOKEN_TTL, lambda: self._drop_unused(peer.token))
        return peer

    def get(self, token: str | None) -> Peer | None:
        """The peer a token was issued to, if it is still valid."""
        return None if token is None else self._peers.get(token)

    def bind(self, token: str, tenant_id: str) -> None:
        """The token's process registered as `tenant_id`; later calls act as that tenant."""
        self._tenant_of[token] = tenant_id

    def tenant_of(self, token: str) -> str | None:
        """The tenant the token was bound to by a registration, if any."""
        return self._tenant_of.get(token)

    def attach(self, token: str) -> None:
        """A session uses the token: it lives as long as the session."""
        self._attached.add(token)

    def revoke(self, token: str) -> None:
        """The session ended: the token is dead."""
        self._peers.pop(token, None)
        self._attached.discard(token)
        self._tenant_of.pop(token, None)
        ended = self._ended.pop(token, None)
        if ended is not None:
            ended.set()

    def attached(self) -> list[str]:
        """The tokens of the sessions open now (attached, not yet revoked)."""
        return list(self._attached)

    def ended(self, token: str) -> asyncio.Event:
        """Set when the session of `token` ends (already set if the token is not valid)."""
        event = self._ended.get(token)
        if event is None:
            event = asyncio.Event()
            if token in self._peers:
                self._ended[token] = event
            else:
                event.set()
        return event

    def _drop_unused(self, token: str) -> None:
        if token not in self._attached:
            self._peers.pop(token, None)
            self._tenant_of.pop(token, None)


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process on the other end of a unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


OnSession = Callable[
    [Peer, asyncio.StreamReader, asyncio.StreamWriter, Callable[[], None]], Awaitable[None]
]
"""Serves what a client sends after its token line (a direct session); returns at its end. It
calls its last argument once the client has said what it came for (its first frame, or its
end): the connection no longer counts against its user's `MAX_UNSAID_PER_UID`."""

MAX_UNSAID_PER_UID = 64
"""Handshake connections one user may hold open before saying what they came for (tenants say
it at once); more are closed unanswered, so that a process that opens connections and never
writes cannot take the agent's file descriptors from every tenant's registration."""


class HandshakeServer:
    """The listening handshake socket and the connections it holds open (direct sessions)."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._unsaid: dict[int, int] = {}
        """Peer UID → its connections that have said nothing yet."""
        self._refusing: set[int] = set()

    def close(self) -> None:
        """Stop listening and end every open connection, so that their clients notice."""
        if self.server is not None:
            self.server.close()
        for writer in list(self._open):
            writer.close()

    async def wait_closed(self) -> None:
        if self.server is not None:
            await self.server.wait_closed()

    def _admit(self, uid: int, pid: int) -> Callable[[], None] | None:
        """Count a new connection of `uid` unsaid; None when the user holds `MAX_UNSAID_PER_UID`
        already (said in one log line, until all of the user's have said something or closed).
        Else the call that stops counting it."""
        held = self._unsaid.get(uid, 0)
        if held >= MAX_UNSAID_PER_UID:
            if uid not in self._refusing:
                self._refusing.add(uid)
                log.warning(
                    "handshake of pid %d refused: uid %d holds %d connections that sent nothing "
                    "(at most %d); refusing its new ones until they close or time out",
                    pid,
                    uid,
                    held,
                    MAX_UNSAID_PER_UID,
                )
            return None
        self._unsaid[uid] = held + 1
        done = False

        def said() -> None:
            nonlocal done
            if done:
                return
            done = True
            left = self._unsaid[uid] - 1
            if left:
                self._unsaid[uid] = left
            else:  # all said: a later refusal is news again
                del self._unsaid[uid]
                self._refusing.discard(uid)

        return said


async def serve_handshake(
    path: str,
    tokens: TokenRegistry,
    mode: int,
    on_session: OnSession | None = None,
    pod_uid_of: Callable[[int], str | None] = lambda pid: None,
) -> HandshakeServer:
    """Listen on `path`; every connection gets one JSON line with its token, issued for the
    pod its process runs in (`pod_uid_of`, read as it connects). Then the connection ends, or,
    with `on_session`, carries the client's direct session."""
    handshake = HandshakeServer()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        said: Callable[[], None] | None = None
        handshake._open.add(writer)
        try:
            pid, uid, gid = peer_credentials(writer.get_extra_info("socket"))
            said = handshake._admit(uid, pid)
            if said is None:
                return
            peer = tokens.issue(pid, uid, gid, pod_uid_of(pid))
            writer.write(json.dumps({"token": peer.token, "pid": pid}).encode() + b"\n")
            await writer.drain()
            if on_session is not None:
                await on_session(peer, reader, writer, said)
        except OSError as exc:
            log.warning("handshake failed: %s", exc)
        finally:
            if said is not None:
                said()
            handshake._open.discard(writer)
            writer.close()

    Path(path).unlink(missing_ok=True)
    handshake.server = await asyncio.start_unix_server(handle, path=path)
    Path(path).chmod(mode)
    return handshake


def may_watch(peer_uid: int, agent_uid: int) -> bool:
    """Whether a peer may watch every tenant's events: the agent's own user, or root."""
    return peer_uid in (agent_uid, 0)
