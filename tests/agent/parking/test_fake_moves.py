"""What each park and restore of the fake backend reads afresh: the tenant's allocation, its
directory and the files it finds there, whatever an earlier move saw."""

from __future__ import annotations

import os
import stat

import pytest

from agent.parking.backends.base import BackendError, Residency
from agent.parking.fakegpu import FakeGpuMemory
from baton.contract.names import MIB

from .conftest import GPU


def tenant(backend, mib: int = 32) -> FakeGpuMemory:
    mem = FakeGpuMemory("t1", backend.root, timeout=0.2)
    mem.allocate(GPU, mib)
    mem.write_pattern(GPU, 7)
    return mem


def test_a_move_carries_the_region_the_tenant_grew_between_turns(backend):
    mem = tenant(backend, mib=32)
    assert backend.park("t1", GPU).bytes == 32 * MIB
    assert backend.restore("t1", GPU).bytes == 32 * MIB
    mem.allocate(GPU, 48)  # its next turn: a larger region
    mem.write_pattern(GPU, 9)
    assert backend.park("t1", GPU).bytes == 48 * MIB
    assert backend.state("t1").parked_bytes == 48 * MIB
    assert backend.restore("t1", GPU).bytes == 48 * MIB
    mem.verify_pattern(GPU, 9)


def test_a_tenants_directory_turned_into_a_link_after_its_moves_is_refused(backend, tmp_path):
    mem = tenant(backend)
    backend.park("t1", GPU)
    backend.restore("t1", GPU)
    elsewhere = tmp_path / "elsewhere"
    mem.dir.rename(elsewhere)
    mem.dir.symlink_to(elsewhere)
    with pytest.raises(BackendError, match="is a symbolic link, not t1's directory"):
        backend.park("t1", GPU)
    assert (elsewhere / f"{GPU}.dev").exists() and not (elsewhere / f"{GPU}.host").exists()


def test_a_link_at_the_copys_temporary_name_is_replaced_never_followed(backend, tmp_path):
    """A tenant plants a link where the agent writes its copy: the agent's file it points at
    stays as it was, and the move goes through."""
    mem = tenant(backend)
    target = tmp_path / "agent-only"
    target.write_text("the agent's token")
    (mem.dir / f"{GPU}.host.moving").symlink_to(target)
    assert backend.park("t1", GPU).bytes == 32 * MIB
    assert target.read_text() == "the agent's token"
    assert not (mem.dir / f"{GPU}.host").is_symlink()
    assert backend.state("t1").residency == {GPU: Residency.PARKED}
    backend.restore("t1", GPU)
    mem.verify_pattern(GPU, 7)


def test_the_lock_and_the_moved_copies_are_open_to_every_uid(backend):
    old = os.umask(0o077)  # what a tenant's umask would leave: owner only
    try:
        mem = tenant(backend)
        lock = mem.dir / "lock"
        lock.touch()
        lock.chmod(0o600)
        backend.park("t1", GPU)
        modes = {p: stat.S_IMODE(os.stat(mem.dir / p).st_mode) for p in ("lock", f"{GPU}.host")}
        assert modes == {"lock": 0o666, f"{GPU}.host": 0o666}
        backend.restore("t1", GPU)
        assert stat.S_IMODE(os.stat(mem.dir / f"{GPU}.dev").st_mode) == 0o666
    finally:
        os.umask(old)
