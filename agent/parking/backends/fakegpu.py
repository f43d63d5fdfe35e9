"""Simulated GPU memory shared by the `fake` backend (agent side) and tenant processes.

Each tenant's "device memory" is a file under the fake GPU directory, outside the agent process,
so an agent crash loses nothing. A tenant allocates its region, writes a seeded pattern during its
turn and verifies it after every restore. Every access holds a shared lock on the tenant's lock
file; the agent holds it exclusively while the tenant is parked, so a parked tenant's access
waits for its restore, as CUDA calls wait under the checkpoint lock.

Layout under the root: `gpus.json` ({"scale": real bytes per simulated byte, "gpus": {uuid:
simulated bytes}}), and per tenant `tenants/<id>/` holding `meta.json`, `lock`, `<gpu>.dev`
(resident bytes) and `<gpu>.host` (parked bytes).

Every file and directory under the root is open to every UID (`share`): the agent (root, but
in its container without the capabilities to override file permissions or change owners) and
tenants of any UID write each other's files there. `tenants/` is sticky, as /tmp is. Simulated
device memory is a stand-in, not a boundary between tenants; but nobody follows a symbolic link
there (`open_file`), so a tenant cannot make the agent read or write a file of the agent's.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import random
import stat
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from baton.contract.names import DEFAULT_FAKE_GPU_DIR, ENV_FAKE_GPU_DIR, MIB

DEVICE_SUFFIX = ".dev"
HOST_SUFFIX = ".host"
CHUNK = 8 * MIB
StrPath = str | os.PathLike[str]


class NotResident(Exception):
    """The tenant's device memory is not on the GPU and was not restored in time."""


class PatternMismatch(Exception):
    """Device memory does not hold the pattern that was written."""


def fake_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The fake GPU directory: `root`, else $BATON_FAKE_GPU_DIR, else the default."""
    return Path(root or os.environ.get(ENV_FAKE_GPU_DIR) or DEFAULT_FAKE_GPU_DIR)


def tenant_dir(root: Path, tenant_id: str) -> Path:
    """Where one tenant's regions live (the id is escaped into one path component)."""
    return root / "tenants" / urllib.parse.quote(tenant_id, safe="")


def read_json(path: StrPath) -> dict[str, Any]:
    """A JSON object from `path`."""
    with open(open_file(path, os.O_RDONLY), "rb", buffering=0) as f:
        data = json.loads(f.readall())
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def open_file(path: StrPath, flags: int, mode: int = 0o666) -> int:
    """`os.open` that refuses a symbolic link (ELOOP) instead of following it."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def new_file(path: StrPath) -> int:
    """A new, empty file at `path` (whatever was there is removed first) open to every UID."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        fd = open_file(path, flags)
    except FileExistsError:  # a leftover, or a tenant's link: removed, never followed
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        fd = open_file(path, flags)
    return share(fd)


def share(fd: int) -> int:
    """Open the file to every UID (read and write) if this process owns it; returns `fd`."""
    st = os.fstat(fd)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != 0o666:
        os.fchmod(fd, 0o666)
    return fd


def shared_dir(path: Path, mode: int = 0o777) -> None:
    """Make the directory (its parent exists) and open it to every UID if this process owns it.
    A directory this makes appears with `mode` already: made under a private name, opened,
    then renamed into place, so a tenant never finds it made and not yet open to it (the agent
    makes a tenant's directory as it learns of the pod, while the pod's process may be making
    its first region there). The agent may also replace an empty one the tenant has just made:
    the tenant opens its own through a descriptor, never by a name that may have changed hands."""
    if not os.path.lexists(path):
        made = tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent)
        os.chmod(made, mode)
        try:
            os.rename(made, path)  # onto an empty directory made meanwhile: replaces it
        except OSError:  # one made meanwhile holds files, or is another UID's (sticky parent)
            os.rmdir(made)
            if not os.path.lexists(path):  # none was: the rename's own failure is the error
                raise
    try:  # through a descriptor: the agent may replace an empty one of ours meanwhile
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.ELOOP):
            raise NotADirectoryError(f"{path} is not a directory (a symbolic link?)") from None
        raise
    try:
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace `path` atomically with `data`."""
    tmp = path.with_name(path.name + ".new")
    with open(new_file(tmp), "w") as f:
        f.write(json.dumps(data))
    os.replace(tmp, path)


def timed_flock(path: StrPath, exclusive: bool, timeout: float) -> int:
    """Open `path` and lock it, waiting at most `timeout` seconds; returns the locked fd."""
    fd = share(open_file(path, os.O_RDWR | os.O_CREAT))
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        pass
    taken = threading.Event()
    guard = threading.Lock()
    abandoned = False

    def take() -> None:
        fcntl.flock(fd, mode)
        with guard:
            if abandoned:
                os.close(fd)
            else:
                taken.set()

    threading.Thread(target=take, name=f"flock {os.path.basename(path)}", daemon=True).start()
    if taken.wait(timeout):
        return fd
    with guard:
        if taken.is_set():
            return fd
        abandoned = True
    raise TimeoutError(f"{path} stayed locked for {timeout:g} s")


def unlock(fd: int) -> None:
    """Release a lock taken with `timed_flock`."""
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def pattern_chunk(seed: int, index: int, size: int) -> bytes:
    """Chunk `index` of the pattern for `seed`."""
    return random.Random(seed * 1_000_003 + index).randbytes(size)


class FakeGpuMemory:
    """A tenant's handle on its simulated device memory."""

    def __init__(
        self, tenant_id: str, root: str | os.PathLike[str] | None = None, timeout: float = 60.0
    ) -> None:
        self.tenant_id = tenant_id
        self.root = fake_root(root)
        self.dir = tenant_dir(self.root, tenant_id)
        self.timeout = timeout
        config = read_json(self.root / "gpus.json")
        self.scale = float(config["scale"])
        self.gpus: dict[str, int] = {str(k): int(v) for k, v in config["gpus"].items()}

    def allocate(self, gpu: str, mib: int, memory_limit_mib: int | None = None) -> None:
        """Take `mib` simulated MiB on `gpu`; `memory_limit_mib` stands in for a cgroup limit."""
        if gpu not in self.gpus:
            raise ValueError(f"{gpu} is not a fake GPU here (have {', '.join(self.gpus)})")
        shared_dir(self.dir)
        meta_path = self.dir / "meta.json"
        meta = read_json(meta_path) if meta_path.exists() else {"footprint": {}}
        meta["tenant_id"] = self.tenant_id
        meta["footprint"][gpu] = mib * MIB
        meta["memory_limit"] = None if memory_limit_mib is None else memory_limit_mib * MIB
        new = self.dir / f"{gpu}.alloc"
        with open(new_file(new), "wb") as f:
            f.truncate(max(1, round(mib * MIB * self.scale)))
        os.replace(new, self.dir / f"{gpu}{DEVICE_SUFFIX}")
        write_json(meta_path, meta)

    @contextlib.contextmanager
    def access(self, gpu: str) -> Iterator[Path]:
        """Hold the device region of `gpu` (waits while it is parked); yields its path."""
        try:
            fd = timed_flock(self.dir / "lock", exclusive=False, timeout=self.timeout)
        except TimeoutError as e:
            raise NotResident(f"{self.tenant_id} was not restored on {gpu}: {e}") from e
        try:
            path = self.dir / f"{gpu}{DEVICE_SUFFIX}"
            if not path.exists():
                raise NotResident(f"{self.tenant_id} has no device memory on {gpu} (parked)")
            yield path
        finally:
            unlock(fd)

    def write_pattern(self, gpu: str, seed: int) -> None:
        """Fill the device region on `gpu` with the pattern for `seed`."""
        with self.access(gpu) as path, open(open_file(path, os.O_RDWR), "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(0)
            for i, off in enumerate(range(0, size, CHUNK)):
                f.write(pattern_chunk(seed, i, min(CHUNK, size - off)))

    def verify_pattern(self, gpu: str, seed: int) -> None:
        """Raise `PatternMismatch` unless the region on `gpu` holds the pattern for `seed`."""
        with self.access(gpu) as path, open(open_file(path, os.O_RDONLY), "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(0)
            for i, off in enumerate(range(0, size, CHUNK)):
                want = pattern_chunk(seed, i, min(CHUNK, size - off))
                if f.read(len(want)) != want:
                    raise PatternMismatch(
                        f"{self.tenant_id} on {gpu}: bytes from offset {off} differ from "
                        f"pattern {seed}"
                    )
