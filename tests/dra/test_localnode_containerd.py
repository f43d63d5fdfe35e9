"""The local node's second runtime: containerd 2.x unpacked from the binaries' directory, with
CDI on (the DRA path needs it; Debian's 1.6 drops CDI devices silently)."""

from __future__ import annotations

import io
import lzma
import tarfile
import tomllib
from pathlib import Path

import pytest

from commands.localnode import runtime
from commands.localnode.binaries import CONTAINERD_COMMANDS, find_containerd2
from commands.localnode.node import LocalNode
from commands.localnode.procs import LocalNodeError


def packed(directory: Path, members: tuple[str, ...] = CONTAINERD_COMMANDS) -> Path:
    """A containerd-v2.*.tar.xz holding `members` as small scripts."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in members:
            body = f"#!/bin/sh\necho {name}\n".encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(body), 0o755
            tar.addfile(info, io.BytesIO(body))
    path = directory / "containerd-v2.3.4-linux-amd64.tar.xz"
    path.write_bytes(lzma.compress(buffer.getvalue()))
    return path


def test_containerd2_is_unpacked_once_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATON_KUBE_BIN_DIR", str(tmp_path / "k8s"))
    monkeypatch.setenv("BATON_LOCALNODE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "k8s").mkdir()
    assert find_containerd2() is None
    packed(tmp_path / "k8s")
    found = find_containerd2()
    assert found is not None and found.parent == tmp_path / "cache" / "bin"
    assert sorted(p.name for p in found.iterdir()) == sorted(CONTAINERD_COMMANDS)
    assert (found / "ctr").stat().st_mode & 0o111
    assert find_containerd2() == found


def test_a_tarball_without_the_shim_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATON_KUBE_BIN_DIR", str(tmp_path))
    monkeypatch.setenv("BATON_LOCALNODE_CACHE", str(tmp_path / "cache"))
    packed(tmp_path, ("containerd", "ctr"))
    with pytest.raises(LocalNodeError, match="containerd-shim-runc-v2"):
        find_containerd2()


def test_containerd2_config_turns_cdi_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "cni_bin_dir", lambda: Path("/usr/lib/cni"))
    monkeypatch.setattr(runtime.shutil, "which", lambda name: f"/usr/bin/{name}")
    daemon = runtime.Containerd(tmp_path, tmp_path / "images", tmp_path / "bin")
    config = tomllib.loads(daemon._config().read_text())
    assert config["version"] == 3
    cri = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert cri["enable_cdi"] is True and "/var/run/cdi" in cri["cdi_spec_dirs"]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["cni"]["conf_dir"] == str(tmp_path / "cni")
    pinned = config["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]
    assert pinned["sandbox"] == runtime.PAUSE_IMAGE
    assert config["grpc"]["address"] == str(daemon.socket)
    assert daemon.ctr("version")[0] == str(tmp_path / "bin" / "ctr")


def test_an_unknown_containerd_choice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LocalNodeError, match="containerd must be"):
        LocalNode(tmp_path, binaries=object(), containerd="1.7")  # type: ignore[arg-type]
