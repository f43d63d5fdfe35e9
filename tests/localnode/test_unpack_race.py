"""Several processes finding the binaries at once (a test session's real node beside other
tests' API servers, two `baton` commands) each get whole files and links."""

from __future__ import annotations

import lzma
import multiprocessing
import shutil
from pathlib import Path

import pytest

from commands.localnode import binaries

PROCESSES = 6
ROUNDS = 8


def _find(barrier: multiprocessing.synchronize.Barrier, queue: multiprocessing.Queue) -> None:
    barrier.wait(10)
    try:
        found = binaries.find_binaries()
        queue.put(None if found is None else str(found.etcd.resolve()))
    except Exception as exc:
        queue.put(f"{type(exc).__name__}: {exc}")


def test_processes_unpacking_at_once_all_find_whole_binaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    packed = tmp_path / "k8s"
    packed.mkdir()
    body = b"#!/bin/sh\n" + b"#" * (1 << 20)
    (packed / "kube-v1.36.2-linux-amd64.xz").write_bytes(lzma.compress(body))
    (packed / "etcd-v3.6.0-linux-amd64.xz").write_bytes(lzma.compress(body + b"etcd"))
    cache = tmp_path / "cache"
    monkeypatch.setenv("BATON_KUBE_BIN_DIR", str(packed))
    monkeypatch.setenv("BATON_LOCALNODE_CACHE", str(cache))
    context = multiprocessing.get_context("fork")
    for _ in range(ROUNDS):
        shutil.rmtree(cache, ignore_errors=True)
        barrier, queue = context.Barrier(PROCESSES), context.Queue()
        procs = [context.Process(target=_find, args=(barrier, queue)) for _ in range(PROCESSES)]
        for proc in procs:
            proc.start()
        said = [queue.get(timeout=30) for _ in procs]
        for proc in procs:
            proc.join(10)
        etcd = {s for s in said if s is not None}
        assert len(etcd) == 1 and None not in said, said
        assert Path(etcd.pop()).read_bytes() == body + b"etcd"
        assert not list(cache.rglob("*.part")), "a part file was left"
