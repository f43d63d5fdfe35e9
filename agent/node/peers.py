"""Who is at the other end of a TCP connection on this host, and noticing when that process ends.

gRPC over TCP carries no SO_PEERCRED, so the agent finds the caller the way `ss -p` does: the
connection's socket inode in /proc/net/tcp{,6} (the agent's network namespace first, then
every other one it can see: pods', when it runs with hostPID), then the process holding that
inode. Callers on other hosts stay unknown. `ProcessWatch` wakes the event loop through a
pidfd the moment a process exits.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

_ESTABLISHED = "01"
_LISTEN = "0A"


@dataclass(frozen=True)
class PeerProcess:
    """The process behind a connection."""

    pid: int
    uid: int


def parse_peer(peer: str) -> tuple[str, int] | None:
    """`ipv4:127.0.0.1:5000` or `ipv6:[::1]:5000` (gRPC's `context.peer()`) to (ip, port)."""
    kind, _, rest = peer.partition(":")
    host, _, port = rest.rpartition(":")
    if kind not in ("ipv4", "ipv6") or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _proc_hex(ip: str) -> tuple[str, str]:
    """The address as /proc/net/tcp (IPv4) and /proc/net/tcp6 spell it."""
    addr = ipaddress.ip_address(ip)
    v6 = addr if addr.version == 6 else ipaddress.IPv6Address(f"::ffff:{addr}")
    raw6 = v6.packed
    words6 = "".join(raw6[i : i + 4][::-1].hex().upper() for i in range(0, 16, 4))
    mapped = v6.ipv4_mapped if addr.version == 6 else addr
    v4 = mapped.packed[::-1].hex().upper() if mapped is not None else ""
    return v4, words6


def _net_dirs(proc_root: Path) -> Iterator[Path]:
    """Our own /proc/net, then one per other network namespace (a pod's, with hostPID)."""
    yield proc_root / "net"
    seen = set()
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            netns = os.readlink(entry / "ns" / "net")
        except OSError:
            continue
        if netns not in seen:
            seen.add(netns)
            yield entry / "net"


def _find_in(net: Path, wanted: set[str], server_port: int) -> int | None:
    for table in ("tcp", "tcp6"):
        try:
            lines = (net / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != _ESTABLISHED or cols[1] not in wanted:
                continue
            if int(cols[2].rsplit(":", 1)[1], 16) == server_port:
                return int(cols[9])
    return None


def socket_inode(peer: str, server_port: int, proc_root: Path = Path("/proc")) -> int | None:
    """The inode of the caller's end of the connection `peer` → our `server_port`."""
    parsed = parse_peer(peer)
    if parsed is None:
        return None
    ip, port = parsed
    v4, v6 = _proc_hex(ip)
    wanted = {f"{a}:{port:04X}" for a in (v4, v6) if a}
    for net in _net_dirs(proc_root):
        inode = _find_in(net, wanted, server_port)
        if inode is not None:
            return inode
    return None


def process_of_socket(inode: int, proc_root: Path = Path("/proc")) -> PeerProcess | None:
    """The process that holds the socket `inode` open (the first found)."""
    found = holder_of_socket(inode, proc_root)
    return None if found is None else found[0]


def holder_of_socket(
    inode: int, proc_root: Path = Path("/proc")
) -> tuple[PeerProcess, Path] | None:
    """The process that holds the socket `inode` open (the first found), and the descriptor's
    path in /proc through which it does."""
    target = f"socket:[{inode}]"
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == target:
                    return PeerProcess(int(entry.name), entry.stat().st_uid), fd
            except OSError:  # this descriptor closed meanwhile: the others still count
                continue
    return None


def listener_process(port: int, proc_root: Path = Path("/proc")) -> PeerProcess | None:
    """The process listening on TCP `port` in our network namespace, if one is."""
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc_root / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if (
                len(cols) >= 10
                and cols[3] == _LISTEN
                and int(cols[1].rsplit(":", 1)[1], 16) == port
            ):
                return process_of_socket(int(cols[9]), proc_root)
    return None


def peer_process(
    peer: str, server_port: int, proc_root: Path = Path("/proc")
) -> PeerProcess | None:
    """The local process calling from `peer`, or None if it is not in our network namespace."""
    inode = socket_inode(peer, server_port, proc_root)
    return None if inode is None else process_of_socket(inode, proc_root)


class Callers:
    """The local process behind each connection to `server_port` (a gRPC peer, `ip:port`),
    found by reading the node's socket tables and every process's descriptors (milliseconds),
    then remembered with the descriptor it holds the connection by. A remembered one is checked
    on every call with one `readlink`: while that descriptor is still the same socket, the
    connection is (no other can have its addresses), but a port a live process closed may be
    another process's since (another pod's), which is then looked up afresh."""

    def __init__(self, watch: ProcessWatch, server_port: int, proc_root: Path) -> None:
        self._watch = watch
        self._port = server_port
        self._proc_root = proc_root
        self.known: dict[str, tuple[PeerProcess, Path, str]] = {}
        """Peer → its process, the descriptor and what it links to (`socket:[inode]`), till
        that process exits."""

    async def of(self, peer: str) -> PeerProcess | None:
        """The process calling from `peer`, or None if it is not in a network namespace here."""
        known = self.known.get(peer)
        if known is not None and _links_to(known[1], known[2]):
            return known[0]
        inode = await asyncio.to_thread(socket_inode, peer, self._port, self._proc_root)
        found = (
            None
            if inode is None
            else await asyncio.to_thread(holder_of_socket, inode, self._proc_root)
        )
        if found is None:  # a miss is not kept: the next call looks again
            self.known.pop(peer, None)
            return None
        process, fd = found
        watched = any(p.pid == process.pid for p, _, _ in self.known.values())
        if watched or self._watch.watch(process.pid, self._exited):
            self.known[peer] = (process, fd, f"socket:[{inode}]")
        return process

    def _exited(self, pid: int) -> None:
        self.known = {k: v for k, v in self.known.items() if v[0].pid != pid}


def _links_to(fd: Path, target: str) -> bool:
    try:
        return os.readlink(fd) == target
    except OSError:  # closed, or its process gone
        return False


class ProcessWatch:
    """Calls back when a watched process exits (a pidfd on the event loop; no polling)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._fds: dict[int, int] = {}
        self._callbacks: dict[int, list[Callable[[int], None]]] = {}

    def watch(self, pid: int, on_exit: Callable[[int], None]) -> bool:
        """Call `on_exit(pid)` once `pid` exits; False if it is gone already (no call then)."""
        if pid not in self._fds:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                return False
            self._fds[pid] = fd
            self._loop.add_reader(fd, self._exited, pid)
        self._callbacks.setdefault(pid, []).append(on_exit)
        return True

    def _exited(self, pid: int) -> None:
        callbacks = self._callbacks.get(pid, [])
        self._forget(pid)
        for on_exit in callbacks:
            on_exit(pid)

    def _forget(self, pid: int) -> None:
        self._callbacks.pop(pid, None)
        fd = self._fds.pop(pid, None)
        if fd is not None:
            self._loop.remove_reader(fd)
            os.close(fd)

    def close(self) -> None:
        """Stop watching everything."""
        for pid in list(self._fds):
            self._forget(pid)
