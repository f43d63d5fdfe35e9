"""The fake backend moves real bytes and survives a crash at any point of a move."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

import agent.parking.backends.fake as fake
from agent.parking.backends.base import BackendError, BackendUnavailable, Residency, TenantRef
from agent.parking.backends.fake import FakeBackend
from agent.parking.backends.fakegpu import shared_dir
from agent.parking.fakegpu import FakeGpuMemory, NotResident, PatternMismatch
from baton.contract.names import MIB

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


def test_a_tenants_state_reads_its_allocation_once_however_many_gpus(fake_root, monkeypatch):
    """The preparer reads every tenant's state at each turn: one file read per tenant, not one
    per GPU of the node (eight reads each on an eight-GPU node slowed every handover)."""
    gpus = {f"GPU-{i}": 100 * MIB for i in range(8)}
    b = FakeBackend(fake_root, gpus, scale=SCALE)
    mem = FakeGpuMemory("t1", b.root)
    mem.allocate("GPU-3", 32)
    b.park("t1", "GPU-3")
    reads: list[Path] = []
    real = fake.read_json

    def counted(path: Path) -> dict[str, object]:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(fake, "read_json", counted)
    st = b.state("t1")
    assert st.residency == {"GPU-3": Residency.PARKED} and st.parked_bytes == 32 * MIB
    assert st.footprint_bytes == {"GPU-3": 32 * MIB}
    assert len(reads) == 1
    b.close()


def test_the_bandwidth_model_stretches_a_move(fake_root):
    b = FakeBackend(fake_root, {GPU: 100 * MIB}, scale=SCALE, pcie_gbps=1.0)
    tenant(b, mib=64)
    move = b.park("t1", GPU)
    assert move.seconds >= 64 * MIB / 1e9
    b.close()


def crash_during_copy(monkeypatch):
    real = fake.copy_file

    def half_copy(fin, src, dst):
        real(fin, src, dst)
        with open(dst, "r+b") as f:
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


def as_uid(uid: int, work: Callable[[], object], keep_root: bool = False) -> None:
    """Run `work` in a forked child that has dropped to `uid` (that GID, no other groups);
    raise what it raised, as text. With `keep_root` only the effective UID drops, so `work`
    may take root back."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only its exit status and the pipe leave it
        os.close(read_end)
        try:
            if keep_root:
                os.seteuid(uid)
            else:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            work()
            os._exit(0)
        except BaseException as err:
            os.write(write_end, repr(err).encode())
            os._exit(1)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        said = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"as UID {uid}: {said}"


@pytest.mark.skipif(os.geteuid() != 0, reason="switching between UIDs takes root")
@pytest.mark.parametrize("attached_first", [True, False], ids=["agent first", "tenant first"])
def test_an_agent_and_a_tenant_of_other_uids_share_the_memory_files(attached_first):
    """In its container the agent is root without the capabilities to override permissions or
    change owners, so it meets the files as another UID would; the tenant runs as its image's
    user. Each must write what the other made, across a park and a restore, and the agent must
    clean up after it. Either may make the tenant's directory first."""
    agent_uid, tenant_uid = 65533, 65534
    root = Path(tempfile.mkdtemp(prefix="baton-fakegpu-", dir="/tmp"))

    def as_agent(*steps: Callable[[FakeBackend], object]) -> None:
        def run() -> None:
            b = FakeBackend(root, {GPU: 100 * MIB}, scale=SCALE, lock_timeout=2.0)
            for step in steps:
                step(b)
            b.close()

        as_uid(agent_uid, run)

    def allocate() -> None:
        mem = FakeGpuMemory("t1", root, timeout=2.0)
        mem.allocate(GPU, 32)
        mem.write_pattern(GPU, 7)

    def check_and_write() -> None:
        mem = FakeGpuMemory("t1", root, timeout=2.0)
        mem.verify_pattern(GPU, 7)
        mem.write_pattern(GPU, 8)

    def moved(b: FakeBackend) -> None:
        assert b.park("t1", GPU).bytes == 32 * MIB
        assert b.restore("t1", GPU).bytes == 32 * MIB

    try:
        root.chmod(0o755)  # as the hostPath directory is
        os.chown(root, agent_uid, agent_uid)  # the agent's fake GPU directory
        as_agent(*([lambda b: b.attach(TenantRef("t1", (GPU,)))] if attached_first else []))
        as_uid(tenant_uid, allocate)
        as_agent(moved)
        as_uid(tenant_uid, check_and_write)
        as_agent(lambda b: b.detach("t1"))
        assert list((root / "tenants").iterdir()) == []
    finally:
        shutil.rmtree(root)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching between UIDs takes root")
@pytest.mark.parametrize("planted", [f"{GPU}.dev", "lock"])
def test_the_agent_follows_no_symbolic_link_a_tenant_plants(planted):
    """A tenant replaces its region or its lock with a link to a file only the agent may read:
    the park fails, and the file is neither copied where the tenant can read it nor opened up."""
    agent_uid, tenant_uid = 65533, 65534
    root = Path(tempfile.mkdtemp(prefix="baton-fakegpu-", dir="/tmp"))
    secret = root / "agent-only"

    def plant() -> None:
        mem = FakeGpuMemory("t1", root, timeout=2.0)
        mem.allocate(GPU, 32)
        (mem.dir / planted).unlink(missing_ok=True)
        (mem.dir / planted).symlink_to(secret)

    def park_refused() -> None:
        b = FakeBackend(root, {GPU: 100 * MIB}, scale=SCALE, lock_timeout=2.0)
        with pytest.raises(OSError):
            b.park("t1", GPU)
        b.close()

    try:
        root.chmod(0o755)
        os.chown(root, agent_uid, agent_uid)
        secret.write_text("the agent's token")
        secret.chmod(0o600)
        os.chown(secret, agent_uid, agent_uid)
        as_uid(agent_uid, lambda: FakeBackend(root, {GPU: 100 * MIB}, scale=SCALE).close())
        as_uid(tenant_uid, plant)
        as_uid(agent_uid, park_refused)
        assert not (root / "tenants" / "t1" / f"{GPU}.host").exists()
        assert secret.stat().st_mode & 0o777 == 0o600
        assert secret.read_text() == "the agent's token"
    finally:
        shutil.rmtree(root)


def test_a_shared_directory_appears_open_never_before(tmp_path, monkeypatch):
    """The agent makes a tenant's directory as it learns of the pod, while the pod's process
    may be making its first region there: the directory must never be seen not yet open."""
    seen = []
    rename = os.rename

    def watched(src, dst):
        seen.append((stat.S_IMODE(os.lstat(src).st_mode), os.path.lexists(dst)))
        rename(src, dst)

    monkeypatch.setattr(os, "rename", watched)
    shared_dir(tmp_path / "tenants", 0o1777)
    assert seen == [(0o1777, False)]  # open before it has its name
    assert stat.S_IMODE((tmp_path / "tenants").stat().st_mode) == 0o1777
    assert [p.name for p in tmp_path.iterdir()] == ["tenants"]


def test_a_shared_directory_made_meanwhile_is_kept_and_nothing_is_left_behind(
    tmp_path, monkeypatch
):
    target = tmp_path / "t1"
    rename = os.rename

    def made_meanwhile(src, dst):  # the tenant made it, and a region in it, first
        target.mkdir()
        (target / "GPU-0.dev").write_bytes(b"x")
        rename(src, dst)

    monkeypatch.setattr(os, "rename", made_meanwhile)
    shared_dir(target)
    assert (target / "GPU-0.dev").read_bytes() == b"x"
    assert stat.S_IMODE(target.stat().st_mode) == 0o777  # ours: opened as before
    assert [p.name for p in tmp_path.iterdir()] == ["t1"]


@pytest.mark.skipif(os.geteuid() != 0, reason="switching between UIDs takes root")
def test_a_tenants_directory_the_agent_replaces_as_the_tenant_opens_it_is_no_error():
    """The tenant (another UID) makes its directory; the agent (root), which looked before it
    was there, renames its own onto the empty one just after the tenant looked at it. The
    tenant must not then chmod a directory that is no longer its own (CI: a DRA real-node
    tenant died with PermissionError)."""
    root = Path(tempfile.mkdtemp())
    try:
        os.chmod(root, 0o1777)
        target = root / "t1"
        tenant_uid = 65532
        agent_made = []

        def agent_replaces() -> None:  # root again for a moment, as the agent
            os.seteuid(0)
            try:
                made = tempfile.mkdtemp(prefix=".t1.", dir=root)
                os.chmod(made, 0o777)
                os.rename(made, target)
                agent_made.append(os.lstat(target).st_uid)
            finally:
                os.seteuid(tenant_uid)

        def tenant() -> None:
            for name in ("lstat", "fstat"):  # whichever the tenant looks with
                looked = getattr(os, name)

                def look(*args, _looked=looked, **kwargs):
                    found = _looked(*args, **kwargs)
                    if not agent_made and found.st_uid == tenant_uid:
                        agent_replaces()
                    return found

                setattr(os, name, look)
            shared_dir(target)
            assert agent_made == [0], "the agent's replacement did not happen"
            (target / "GPU-0.dev").write_bytes(b"x")  # its first region, in the agent's

        as_uid(tenant_uid, tenant, keep_root=True)
        assert target.stat().st_uid == 0
        assert stat.S_IMODE(target.stat().st_mode) == 0o777
        assert (target / "GPU-0.dev").read_bytes() == b"x"
    finally:
        shutil.rmtree(root)


def test_a_shared_directory_that_cannot_be_put_in_place_says_why(tmp_path, monkeypatch):
    def refused(src, dst):
        raise PermissionError(13, "refused", str(dst))

    monkeypatch.setattr(os, "rename", refused)
    with pytest.raises(PermissionError, match="refused"):
        shared_dir(tmp_path / "t1")
    assert list(tmp_path.iterdir()) == []  # the private directory is gone too


def test_memory_parked_on_a_gpu_the_flags_no_longer_simulate_stops_the_backend(backend):
    """Restarted with fewer --fake-gpus, the agent would grant its tenant turns without that
    memory and delete the parked copy with the tenant: it refuses to start, naming both."""
    mem = FakeGpuMemory("t1", backend.root, timeout=0.2)
    mem.allocate(GPU1, 32)
    backend.park("t1", GPU1)
    backend.close()
    with pytest.raises(BackendUnavailable, match=rf"parked on {GPU1}, which --fake-gpus no"):
        FakeBackend(backend.root, {GPU: 100 * MIB}, scale=SCALE)
    assert (mem.dir / f"{GPU1}.host").exists()
    FakeBackend(backend.root, {GPU: 100 * MIB, GPU1: 100 * MIB}, scale=SCALE).close()
