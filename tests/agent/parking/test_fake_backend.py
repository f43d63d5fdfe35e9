"""The fake backend moves real bytes and survives a crash at any point of a move."""

from __future__ import annotations

import pytest

import agent.parking.backends.fake as fake
from agent.parking.backends.base import BackendError, Residency
from agent.parking.backends.fake import FakeBackend
from agent.parking.fakegpu import FakeGpuMemory, NotResident, PatternMismatch
from baton.names import MIB

from .conftest import GPU, GPU1, SCALE


class Crash(BaseException):
    """Stands in for the agent dying at this point."""


def tenant(backend, name="t1", mib=32, seed=7) -> FakeGpuMemory:
    mem = FakeGpuMemory(name, backend.root, timeout=0.2)
    mem.allocate(GPU, mib)
    mem.write_pattern(GPU, seed)
    return mem


def test_park_and_restore_move_the_bytes_and_keep_the_pattern(backend):
    mem = tenant(backend)
    dev = mem.dir / f"{GPU}.dev"
    assert dev.stat().st_size == int(32 * MIB * SCALE)
    move = backend.park("t1", GPU)
    assert (move.direction, move.bytes) == ("park", 32 * MIB)
    assert not dev.exists() and (mem.dir / f"{GPU}.host").exists()
    st = backend.state("t1")
    assert st.residency == {GPU: Residency.PARKED} and st.parked_bytes == 32 * MIB
    backend.restore("t1", GPU)
    assert backend.state("t1").residency == {GPU: Residency.RESIDENT}
    mem.verify_pattern(GPU, 7)
    with pytest.raises(PatternMismatch):
        mem.verify_pattern(GPU, 8)


def test_a_parked_tenants_access_waits_for_its_restore(backend):
    mem = tenant(backend)
    backend.park("t1", GPU)
    with pytest.raises(NotResident, match="not restored"):
        mem.verify_pattern(GPU, 7)
    backend.restore("t1", GPU)
    mem.verify_pattern(GPU, 7)


def test_a_park_waits_for_the_tenants_access_and_gives_up_leaving_it_resident(fake_root):
    b = FakeBackend(fake_root, {GPU: 100 * MIB}, scale=SCALE, lock_timeout=0.1)
    mem = tenant(b)
    with mem.access(GPU), pytest.raises(BackendError, match="busy"):
        b.park("t1", GPU)
    assert b.state("t1").residency == {GPU: Residency.RESIDENT}
    mem.verify_pattern(GPU, 7)
    b.park("t1", GPU)
    b.close()


def test_footprint_memory_limit_and_tenants_come_from_the_tenants_allocation(backend):
    mem = FakeGpuMemory("ns/pod-a", backend.root)
    mem.allocate(GPU1, 48, memory_limit_mib=20)
    assert backend.tenants() == ["ns/pod-a"]
    assert backend.footprint("ns/pod-a", GPU1) == 48 * MIB
    assert backend.footprint("ns/pod-a", GPU) == 0
    assert backend.memory_limit("ns/pod-a") == 20 * MIB
    backend.detach("ns/pod-a")
    assert backend.tenants() == []


def test_the_bandwidth_model_stretches_a_move(fake_root):
    b = FakeBackend(fake_root, {GPU: 100 * MIB}, scale=SCALE, pcie_gbps=1.0)
    tenant(b, mib=64)
    move = b.park("t1", GPU)
    assert move.seconds >= 64 * MIB / 1e9
    b.close()


def crash_during_copy(monkeypatch):
    real = fake.copy_file

    def half_copy(src, dst):
        real(src, dst)
        with dst.open("r+b") as f:
            f.truncate(f.seek(0, 2) // 2)
        raise Crash

    monkeypatch.setattr(fake, "copy_file", half_copy)


def crash_before_dropping_source(monkeypatch):
    real = fake.os.replace

    def replace_then_die(src, dst):
        real(src, dst)
        if str(dst).endswith((".dev", ".host")):
            raise Crash

    monkeypatch.setattr(fake.os, "replace", replace_then_die)


@pytest.mark.parametrize("crash", [crash_during_copy, crash_before_dropping_source])
@pytest.mark.parametrize("direction", ["park", "restore"])
def test_a_crash_mid_move_is_reconciled_without_loss_or_duplicate(
    fake_root, monkeypatch, crash, direction
):
    b = FakeBackend(fake_root, {GPU: 100 * MIB}, scale=SCALE)
    mem = tenant(b)
    if direction == "restore":
        b.park("t1", GPU)
    with monkeypatch.context() as m:
        crash(m)
        with pytest.raises(Crash):
            getattr(b, direction)("t1", GPU)
    b.close()
    again = FakeBackend(fake_root, {GPU: 100 * MIB}, scale=SCALE)
    files = sorted(p.name for p in mem.dir.iterdir() if p.name.startswith(GPU))
    assert len(files) == 1, files
    again.restore("t1", GPU)
    mem.verify_pattern(GPU, 7)
    assert again.state("t1").parked_bytes == 0
    again.close()
