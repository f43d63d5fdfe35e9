"""docker-archive tarballs (what `docker save` writes and `ctr images import` reads)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterable, Mapping
from pathlib import Path


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def layer_from_files(out: Path, files: Mapping[str, Path], mode: int = 0o755) -> Path:
    """An uncompressed layer tar holding `files` (path in the image → file here)."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for name in sorted(files):
            parts = name.strip("/").split("/")
            for depth in range(1, len(parts)):
                directory = "/".join(parts[:depth])
                if directory not in dirs:
                    info = tarfile.TarInfo(directory)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                    dirs.add(directory)
            source = files[name].resolve()
            info = tar.gettarinfo(str(source), arcname=name.strip("/"))
            info.mode, info.uid, info.gid, info.uname, info.gname = mode, 0, 0, "", ""
            with source.open("rb") as f:
                tar.addfile(info, f)
    return out


def write_archive(
    out: Path, tag: str, layers: Iterable[Path], config: Mapping[str, object]
) -> Path:
    """A docker-archive with the given layer tars (bottom first) and image config fields."""
    layer_list = list(layers)
    diff_ids = [f"sha256:{sha256_file(layer)}" for layer in layer_list]
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": dict(config),
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": "commands.localnode"} for _ in layer_list],
    }
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    config_name = f"{hashlib.sha256(config_bytes).hexdigest()}.json"
    layer_names = [f"{d.removeprefix('sha256:')}/layer.tar" for d in diff_ids]
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": layer_names}]
    part = out.with_suffix(".part")
    with tarfile.open(part, "w") as tar:
        _add_bytes(tar, config_name, config_bytes)
        for name, layer in zip(layer_names, layer_list, strict=True):
            tar.add(str(layer), arcname=name)
        _add_bytes(tar, "manifest.json", json.dumps(manifest).encode())
    part.rename(out)
    return out


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
