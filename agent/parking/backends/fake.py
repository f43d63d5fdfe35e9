"""Simulated GPUs whose device memory is real bytes in files outside the agent process.

Park copies `<gpu>.dev` to `<gpu>.host` and removes the device file; restore copies it back. Each
move writes the whole copy under a temporary name, commits it with a rename, then drops the
source, so a crash at any point leaves at least one complete copy; `reconcile` (run at start)
removes half-written copies and keeps the device copy where both survived.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from agent.parking.backends.base import (
    Backend,
    BackendError,
    BackendUnavailable,
    Move,
    Residency,
    TenantRef,
    TenantState,
)
from agent.parking.backends.fakegpu import (
    DEVICE_SUFFIX,
    HOST_SUFFIX,
    StrPath,
    new_file,
    open_file,
    read_json,
    shared_dir,
    tenant_dir,
    timed_flock,
    unlock,
    write_json,
)

TMP_SUFFIX = ".moving"
log = logging.getLogger(__name__)


def copy_file(fin: int, src: str, dst: str) -> None:
    """Copy the open file `fin` (`src`) to a new file `dst` inside the kernel
    (copy_file_range), without fsync."""
    fout = new_file(dst)
    try:
        left = os.fstat(fin).st_size
        while left:
            n = os.copy_file_range(fin, fout, left)
            if n == 0:
                raise BackendError(f"{src} shrank while being copied")
            left -= n
    finally:
        os.close(fout)


class FakeBackend(Backend):
    """Parks and restores tenants' simulated device memory under `root`."""

    name = "fake"

    def __init__(
        self,
        root: str | os.PathLike[str],
        gpus: Mapping[str, int],
        scale: float = 1.0,
        pcie_gbps: float | None = None,
        lock_timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = Path(root)
        self.gpus = dict(gpus)
        self.scale = scale
        self.pcie_gbps = pcie_gbps
        self.lock_timeout = lock_timeout
        self._clock = clock
        self._closing = threading.Event()
        self._locks: dict[str, int] = {}
        self._dirs: dict[str, str] = {}  # tenant id: its directory's name (escaped once)
        self._mutex = threading.Lock()
        self.root.mkdir(parents=True, exist_ok=True)
        shared_dir(self.root / "tenants", 0o1777)  # each tenant may make its own directory
        self._refuse_gpus_gone()
        write_json(self.root / "gpus.json", {"scale": scale, "gpus": self.gpus})
        for line in self.reconcile():
            log.warning("reconciled an interrupted move: %s", line)

    def reconcile(self) -> list[str]:
        """Finish or undo moves a crash interrupted; returns what was done, one line each."""
        done = []
        for tdir in self._tenant_dirs():
            for tmp in tdir.glob(f"*{TMP_SUFFIX}"):
                tmp.unlink()
                done.append(f"removed half-written {tmp}")
            for host in tdir.glob(f"*{HOST_SUFFIX}"):
                dev = host.with_suffix(DEVICE_SUFFIX)
                if dev.exists():
                    host.unlink()
                    done.append(f"kept device copy {dev}, dropped its duplicate {host.name}")
            tenant_id = self._tenant_id(tdir)
            if tenant_id and self._parks_any(tdir):
                self._hold(tenant_id, self._dir(tenant_id))
        return done

    def _refuse_gpus_gone(self) -> None:
        """`BackendUnavailable` if memory is parked for a GPU these flags no longer simulate (a
        restart with fewer `--fake-gpus`): its tenant could never have it back, and its
        parked copy would go with the tenant."""
        for tdir in self._tenant_dirs():
            gone = sorted({host.stem for host in tdir.glob(f"*{HOST_SUFFIX}")} - set(self.gpus))
            if gone:
                raise BackendUnavailable(
                    f"{tdir} holds memory parked on {', '.join(gone)}, which --fake-gpus no "
                    f"longer simulates (it has {', '.join(self.gpus) or 'none'}): restart with "
                    "the GPUs it had, or remove that directory to forget the memory"
                )

    def _tenant_dirs(self) -> list[Path]:
        """The tenants' directories; anything else in `tenants/` (a symbolic link) is passed by."""
        found = (self.root / "tenants").iterdir()
        return sorted(d for d in found if d.is_dir() and not d.is_symlink())

    def _tenant_id(self, tdir: StrPath) -> str | None:
        meta = self._read_meta(tdir)
        return str(meta["tenant_id"]) if meta else None

    def _dir(self, tenant_id: str) -> str:
        """The tenant's directory; refused if it is a symbolic link. A string, not a `Path`:
        every park and restore joins names to it, and a string costs the least CPU."""
        path = self._dirs.get(tenant_id)
        if path is None:
            path = self._dirs[tenant_id] = os.fspath(tenant_dir(self.root, tenant_id))
        if os.path.islink(path):
            raise BackendError(f"{path} is a symbolic link, not {tenant_id}'s directory")
        return path

    def _read_meta(self, tdir: StrPath) -> dict[str, object]:
        """What the tenant wrote of its allocation; nothing before its first region."""
        try:
            return read_json(f"{tdir}/meta.json")
        except FileNotFoundError:
            return {}

    def _footprint(self, tdir: str, gpu: str) -> int:
        fp = self._read_meta(tdir).get("footprint", {})
        return int(fp.get(gpu, 0)) if isinstance(fp, dict) else 0

    def attach(self, tenant: TenantRef) -> None:
        """Make the tenant's directory; the tenant allocates its regions itself."""
        shared_dir(Path(self._dir(tenant.tenant_id)))

    def detach(self, tenant_id: str) -> None:
        """Drop every region of the tenant, parked copies included."""
        self._release(tenant_id)
        tdir = self._dir(tenant_id)
        if os.path.exists(tdir):
            for name in os.listdir(tdir):
                os.unlink(f"{tdir}/{name}")
            os.rmdir(tdir)
        self._dirs.pop(tenant_id, None)

    def tenants(self) -> list[str]:
        """Tenants with regions under the root."""
        ids = (self._tenant_id(d) for d in self._tenant_dirs())
        return [t for t in ids if t]

    def footprint(self, tenant_id: str, gpu: str) -> int:
        """Simulated bytes the tenant allocated on `gpu`."""
        return self._footprint(self._dir(tenant_id), gpu)

    def memory_limit(self, tenant_id: str) -> int | None:
        """The limit the tenant declared in place of a memory cgroup."""
        limit = self._read_meta(self._dir(tenant_id)).get("memory_limit")
        return int(limit) if isinstance(limit, int) else None

    def state(self, tenant_id: str) -> TenantState:
        """Per GPU residency from which files exist."""
        tdir = self._dir(tenant_id)
        st = TenantState(tenant_id)
        footprint = self._read_meta(tdir).get("footprint", {})
        if not isinstance(footprint, dict):
            footprint = {}
        names = set(os.listdir(tdir)) if os.path.isdir(tdir) else set()
        for gpu in self.gpus:  # one read and one listing per tenant: the preparer asks for all
            size = int(footprint.get(gpu, 0))
            host = f"{gpu}{HOST_SUFFIX}"
            if host in names and os.path.exists(f"{tdir}/{host}"):
                st.residency[gpu] = Residency.PARKED
                st.parked_bytes += size
            elif size:
                st.residency[gpu] = Residency.RESIDENT
            if size:
                st.footprint_bytes[gpu] = size
        return st

    def park(self, tenant_id: str, gpu: str) -> Move:
        """Copy the device region to host, commit it, then free the device region."""
        tdir = self._dir(tenant_id)
        self._hold(tenant_id, tdir)
        try:
            return self._move(tenant_id, tdir, gpu, DEVICE_SUFFIX, HOST_SUFFIX, "park")
        except BaseException:
            if not self._parks_any(tdir):
                self._release(tenant_id)
            raise

    def restore(self, tenant_id: str, gpu: str) -> Move:
        """Copy the parked region back to the device, commit it, then free the host copy."""
        tdir = self._dir(tenant_id)
        move = self._move(tenant_id, tdir, gpu, HOST_SUFFIX, DEVICE_SUFFIX, "restore")
        if not self._parks_any(tdir):
            self._release(tenant_id)
        return move

    def _move(
        self, tenant_id: str, tdir: str, gpu: str, src_sfx: str, dst_sfx: str, direction: str
    ) -> Move:
        src, dst = f"{tdir}/{gpu}{src_sfx}", f"{tdir}/{gpu}{dst_sfx}"
        size = self._footprint(tdir, gpu)
        try:  # no symbolic link is followed: the tenant could point one at a file of the agent's
            fin = open_file(src, os.O_RDONLY)
        except FileNotFoundError:
            if os.path.exists(dst) or not size:
                return Move(tenant_id, gpu, direction, 0, 0.0)
            raise BackendError(
                f"{tenant_id} has neither {gpu}{src_sfx} nor {gpu}{dst_sfx} on {gpu}"
            ) from None
        start = self._clock()
        tmp = f"{dst}{TMP_SUFFIX}"
        try:
            copy_file(fin, src, tmp)
        finally:
            os.close(fin)
        self._model_bandwidth(tmp, size, start)
        os.replace(tmp, dst)
        os.unlink(src)
        return Move(tenant_id, gpu, direction, size, self._clock() - start)

    def _model_bandwidth(self, tmp: str, size: int, start: float) -> None:
        """Stretch a move of `size` simulated bytes to size / bandwidth seconds."""
        if self.pcie_gbps:
            remaining = size / (self.pcie_gbps * 1e9) - (self._clock() - start)
            if remaining > 0:
                log.info("copied %s; committing in %.3f s (modelled transfer)", tmp, remaining)
                self._closing.wait(remaining)

    def _parks_any(self, tdir: StrPath) -> bool:
        """Whether the tenant has a region parked on any GPU."""
        try:
            return any(name.endswith(HOST_SUFFIX) for name in os.listdir(tdir))
        except FileNotFoundError:
            return False

    def _hold(self, tenant_id: str, tdir: str) -> None:
        """Take the tenant's lock exclusively (its accesses wait) unless already held."""
        with self._mutex:
            if tenant_id in self._locks:
                return
        try:
            fd = timed_flock(f"{tdir}/lock", True, self.lock_timeout)
        except TimeoutError as e:
            raise BackendError(f"{tenant_id} kept its device memory busy: {e}") from e
        with self._mutex:
            self._locks[tenant_id] = fd

    def _release(self, tenant_id: str) -> None:
        with self._mutex:
            fd = self._locks.pop(tenant_id, None)
        if fd is not None:
            unlock(fd)

    def close(self) -> None:
        """Cut modelled waits short and release locks; parked regions stay on disk."""
        self._closing.set()
        for tenant_id in list(self._locks):
            self._release(tenant_id)
