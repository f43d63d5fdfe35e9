"""Finding the Kubernetes and etcd binaries, unpacking the packed ones into a cache."""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

from commands.localnode.procs import LocalNodeError

ENV_BIN_DIR = "BATON_KUBE_BIN_DIR"
ENV_CACHE_DIR = "BATON_LOCALNODE_CACHE"
KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")
CHECKOUT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """Where unpacked binaries, built images and containerd's content live between runs."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "baton-localnode"
    return Path(os.environ.get(ENV_CACHE_DIR) or default)


@dataclass(frozen=True)
class KubeBinaries:
    """Paths of one executable per component."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubelet: Path

    def version_dir(self) -> Path:
        """The directory the binaries are in."""
        return self.kubelet.parent


def _unpack(packed: Path, into: Path) -> Path:
    """`packed` (.xz) decompressed into `into`, keyed by its content hash; reused when there."""
    digest = hashlib.sha256(packed.read_bytes()).hexdigest()[:16]
    out = into / f"{packed.name.removesuffix('.xz')}-{digest}"
    if not out.exists():
        into.mkdir(parents=True, exist_ok=True)
        part = out.with_name(f"{out.name}.{os.getpid()}.part")  # another process may unpack too
        with lzma.open(packed) as src, part.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        part.chmod(0o755)
        part.rename(out)  # atomic: the other's whole file, or this one
    return out


def _link(link: Path, target: Path) -> None:
    """Point `link` at `target` in one step (a process unpacking beside this one sees the old
    link or the new, never none)."""
    if link.is_symlink() and link.readlink() == target:
        return
    part = link.with_name(f"{link.name}.{os.getpid()}.part")
    part.unlink(missing_ok=True)
    part.symlink_to(target)
    part.rename(link)


def _from_packed(directory: Path) -> KubeBinaries | None:
    """Binaries from `kube-*.xz` and `etcd-*.xz` in `directory` (the shared layout)."""
    kube = sorted(directory.glob("kube-v*-linux-amd64.xz"))
    etcd = sorted(directory.glob("etcd-v*-linux-amd64.xz"))
    if not kube or not etcd:
        return None
    bin_dir = cache_dir() / "bin"
    kube_bin = _unpack(kube[-1], bin_dir)
    etcd_bin = _unpack(etcd[-1], bin_dir)
    links = bin_dir / kube_bin.name.replace("kube-", "links-", 1)
    links.mkdir(exist_ok=True)
    for command in KUBE_COMMANDS:
        _link(links / command, kube_bin)
    _link(links / "etcd", etcd_bin)
    return _from_plain(links)


def _from_plain(directory: Path) -> KubeBinaries | None:
    """Binaries named after their commands in `directory` (the official release layout)."""
    paths = {name: directory / name for name in ("etcd", *KUBE_COMMANDS)}
    if not all(os.access(path, os.X_OK) for path in paths.values()):
        return None
    return KubeBinaries(
        etcd=paths["etcd"],
        kube_apiserver=paths["kube-apiserver"],
        kube_controller_manager=paths["kube-controller-manager"],
        kube_scheduler=paths["kube-scheduler"],
        kubelet=paths["kubelet"],
    )


def search_dirs() -> list[Path]:
    """Where binaries are looked for: $BATON_KUBE_BIN_DIR, else ../shared/k8s by the checkout."""
    named = os.environ.get(ENV_BIN_DIR)
    if named:
        return [Path(named)]
    return [CHECKOUT.parent / "shared" / "k8s", CHECKOUT.parent.parent / "shared" / "k8s"]


def find_binaries() -> KubeBinaries | None:
    """The binaries from the first search directory that has them, or None."""
    for directory in search_dirs():
        if directory.is_dir():
            found = _from_plain(directory) or _from_packed(directory)
            if found:
                return found
    return None


def require_binaries() -> KubeBinaries:
    """The binaries, or LocalNodeError saying where they were looked for."""
    found = find_binaries()
    if found is None:
        where = ", ".join(str(d) for d in search_dirs())
        raise LocalNodeError(
            f"no Kubernetes binaries in {where}: set {ENV_BIN_DIR} to a directory with etcd,"
            f" {', '.join(KUBE_COMMANDS)} (or the packed kube-*.xz and etcd-*.xz)"
        )
    return found


CONTAINERD_COMMANDS = ("containerd", "containerd-shim-runc-v2", "ctr")


def find_containerd2() -> Path | None:
    """A directory with containerd 2.x, its shim and ctr, unpacked from the search directory's
    `containerd-v2*-linux-amd64.tar.xz` (the shared layout), or None when there is none."""
    for directory in search_dirs():
        packed = sorted(directory.glob("containerd-v2.*-linux-amd64.tar.xz"))
        if directory.is_dir() and packed:
            return _untar(packed[-1], cache_dir() / "bin")
    return None


def _untar(packed: Path, into: Path) -> Path:
    """The .tar.xz's executables in a directory keyed by its content hash; reused when there."""
    digest = hashlib.sha256(packed.read_bytes()).hexdigest()[:16]
    out = into / f"{packed.name.removesuffix('.tar.xz')}-{digest}"
    if not out.exists():
        part = out.with_name(f"{out.name}.{os.getpid()}.part")  # another process may unpack too
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir(parents=True)
        with tarfile.open(packed, "r:xz") as tar:
            for member in tar.getmembers():
                name = Path(member.name).name
                if member.isfile() and name in CONTAINERD_COMMANDS:
                    source = tar.extractfile(member)
                    assert source is not None
                    with source, (part / name).open("wb") as dst:
                        shutil.copyfileobj(source, dst, 1 << 20)
                    (part / name).chmod(0o755)
        missing = [c for c in CONTAINERD_COMMANDS if not (part / c).exists()]
        if missing:
            shutil.rmtree(part, ignore_errors=True)
            raise LocalNodeError(f"{packed} lacks {', '.join(missing)}")
        try:
            part.rename(out)
        except OSError:  # another process's is there (a directory is not replaced): use it
            shutil.rmtree(part, ignore_errors=True)
            if not out.is_dir():
                raise
    return out


def find_helm() -> Path | None:
    """Helm: `helm` in the search directory, else its packed `helm-v*-linux-amd64.xz` unpacked
    into the cache, else None."""
    for directory in search_dirs():
        plain = directory / "helm"
        if os.access(plain, os.X_OK):
            return plain
        packed = sorted(directory.glob("helm-v*-linux-amd64.xz"))
        if packed:
            return _unpack(packed[-1], cache_dir() / "bin")
    return None
