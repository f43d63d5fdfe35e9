"""The agent's state store: a snapshot plus a journal of what changed since it (grants, ends,
tenants joined, changed and gone, parked memory).

Each test reads the state back with a fresh `StateStore`, as an agent restarted after a crash
does, so what was only in the old store's memory does not count.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.core.fairsave import FairLags, Lag
from agent.core.leases import Lease
from agent.node import state
from agent.node.state import JOURNAL_FILE, PersistedState, StateDirError, StateStore
from agent.node.state_json import SavedResume
from agent.node.tenants import Tenant

A = Tenant(tenant_id="local/a", name="a", gpus=("GPU-0",))


def lease(lease_id: str, token: int, tenant: str = "local/a") -> Lease:
    return Lease(lease_id, tenant, ("GPU-0",), {"GPU-0": token}, 1.0, 31.0)


def restarted(path: Path) -> PersistedState:
    return StateStore(path).load()


def test_a_grant_recorded_before_any_snapshot_of_it_is_restored_with_its_token(tmp_path):
    store = StateStore(tmp_path)
    store.save(PersistedState(tenants=[A], tokens={"GPU-0": 4}))
    store.record_grant(lease("w1", 5))
    loaded = restarted(tmp_path)
    assert [x.lease_id for x in loaded.leases] == ["w1"]
    assert loaded.tokens == {"GPU-0": 5} and loaded.replayed == 1


def test_an_end_recorded_after_the_snapshot_removes_the_lease(tmp_path):
    store = StateStore(tmp_path)
    store.record_grant(lease("w1", 1))
    store.save(PersistedState(tenants=[A], leases=[lease("w1", 1)], tokens={"GPU-0": 1}))
    store.record_end("w1")
    store.record_grant(lease("w2", 2))
    loaded = restarted(tmp_path)
    assert [x.lease_id for x in loaded.leases] == ["w2"]
    assert loaded.tokens == {"GPU-0": 2} and loaded.replayed == 2


def test_a_tenant_gone_after_the_snapshot_stays_gone_with_its_leases(tmp_path):
    b = Tenant(tenant_id="local/b", name="b", gpus=("GPU-0",))
    store = StateStore(tmp_path)
    store.save(PersistedState(tenants=[A, b], leases=[lease("w1", 1)], tokens={"GPU-0": 1}))
    store.record_grant(lease("w2", 2, "local/b"))
    store.record_gone("local/a")  # its lease w1 went with it (its end line may not have)
    loaded = restarted(tmp_path)
    assert [t.tenant_id for t in loaded.tenants] == ["local/b"]
    assert [x.lease_id for x in loaded.leases] == ["w2"]
    assert loaded.tokens == {"GPU-0": 2}


def test_the_last_parked_record_in_the_journal_replaces_the_snapshots(tmp_path):
    store = StateStore(tmp_path)
    store.save(PersistedState(tenants=[A], parked={"local/a": {"GPU-0": 1}}))
    store.record_parked({"local/a": {"GPU-0": 2}})
    store.record_parked({})  # restored since: nothing parked
    assert restarted(tmp_path).parked == {}
    store.record_parked({"local/a": {"GPU-0": 3}})
    assert restarted(tmp_path).parked == {"local/a": {"GPU-0": 3}}


def test_a_written_snapshot_cuts_a_long_journal_back_to_the_entries_after_it(tmp_path, monkeypatch):
    monkeypatch.setattr(state, "JOURNAL_COMPACT_BYTES", 1)
    store = StateStore(tmp_path)
    store.record_grant(lease("w1", 1))
    store.save(PersistedState(tenants=[A], leases=[lease("w1", 1)], tokens={"GPU-0": 1}))
    assert (tmp_path / JOURNAL_FILE).read_bytes() == b""
    store.record_end("w1")
    covering = PersistedState(tenants=[A], tokens={"GPU-0": 1})
    store.save_soon(covering)  # encoded now: it covers the end, not the grant below
    store.record_grant(lease("w2", 2))
    store.flush()
    assert b'"w2"' in (tmp_path / JOURNAL_FILE).read_bytes()
    assert b'"w1"' not in (tmp_path / JOURNAL_FILE).read_bytes()
    loaded = restarted(tmp_path)
    assert [x.lease_id for x in loaded.leases] == ["w2"] and loaded.replayed == 1


def test_a_short_journal_is_left_alone_by_background_snapshots(tmp_path):
    store = StateStore(tmp_path)
    store.record_grant(lease("w1", 1))
    store.save_soon(PersistedState(tenants=[A], leases=[lease("w1", 1)], tokens={"GPU-0": 1}))
    store.flush()
    assert b'"w1"' in (tmp_path / JOURNAL_FILE).read_bytes()
    loaded = restarted(tmp_path)
    assert [x.lease_id for x in loaded.leases] == ["w1"] and loaded.replayed == 0


def test_entries_the_snapshot_covers_are_not_applied_twice(tmp_path):
    store = StateStore(tmp_path)
    store.record_grant(lease("w1", 1))
    store.record_end("w1")
    journal = (tmp_path / JOURNAL_FILE).read_bytes()
    store.save(PersistedState(tenants=[A], tokens={"GPU-0": 1}))
    (tmp_path / JOURNAL_FILE).write_bytes(journal)  # as if killed before the journal emptied
    loaded = restarted(tmp_path)
    assert loaded.leases == [] and loaded.replayed == 0


def test_a_torn_last_line_is_the_interrupted_write_and_is_skipped(tmp_path):
    store = StateStore(tmp_path)
    store.save(PersistedState(tenants=[A]))
    store.record_grant(lease("w1", 1))
    with open(tmp_path / JOURNAL_FILE, "ab") as f:
        f.write(b'{"grant": {"lease_id": "w2"')
    assert [x.lease_id for x in restarted(tmp_path).leases] == ["w1"]


def test_a_damaged_line_before_the_end_is_refused_with_its_number(tmp_path):
    store = StateStore(tmp_path)
    store.record_grant(lease("w1", 1))
    with open(tmp_path / JOURNAL_FILE, "ab") as f:
        f.write(b"not json\n")
    store.record_grant(lease("w2", 2))
    with pytest.raises(StateDirError, match=r"agent-journal.jsonl line 2: .*move it aside"):
        restarted(tmp_path)


def test_a_resume_granted_after_the_snapshot_keeps_the_revoked_lease_it_follows(tmp_path):
    """A client that never heard its turn given back names the revoked lease: the restarted
    agent still knows which turn follows it, and forgets it once that turn ends."""
    store = StateStore(tmp_path)
    store.save(PersistedState(tenants=[A]))
    store.record_end("w1", resumes=[SavedResume("r1", "local/a", ("GPU-0",), ("w1",))])
    store.record_grant(lease("r1", 2))
    loaded = restarted(tmp_path)
    assert [x.lease_id for x in loaded.leases] == ["r1"] and loaded.given == {"r1": ("w1",)}
    store.save(loaded)  # a snapshot holds it too
    assert restarted(tmp_path).given == {"r1": ("w1",)}
    store.record_end("r1")
    assert restarted(tmp_path).given == {}


def test_a_lease_of_a_tenant_the_snapshot_lacks_is_dropped_but_its_token_kept(tmp_path):
    store = StateStore(tmp_path)
    store.save(PersistedState(tenants=[A]))
    store.record_grant(lease("w9", 7, tenant="local/new"))
    loaded = restarted(tmp_path)
    assert loaded.leases == [] and loaded.tokens == {"GPU-0": 7}


def test_numbering_continues_after_a_restart(tmp_path):
    store = StateStore(tmp_path)
    store.record_grant(lease("w1", 1))
    store.save(PersistedState(tenants=[A], leases=[lease("w1", 1)], tokens={"GPU-0": 1}))
    again = StateStore(tmp_path)
    again.load()
    again.record_end("w1")
    assert restarted(tmp_path).leases == []


def test_a_snapshot_after_a_restart_cuts_back_the_journal_it_loaded(tmp_path):
    store = StateStore(tmp_path)
    store.save(PersistedState(tenants=[A]))
    store.record_grant(lease("w1", 1))
    again = StateStore(tmp_path)
    loaded = again.load()
    again.save(PersistedState(tenants=[A], leases=loaded.leases, tokens=loaded.tokens))
    assert (tmp_path / JOURNAL_FILE).read_bytes() == b""
    assert [x.lease_id for x in restarted(tmp_path).leases] == ["w1"]


def test_a_torn_last_line_is_cut_off_so_the_next_restart_reads_what_followed(tmp_path):
    """The agent restarted after a crash mid-write appends its next entries: they start a line
    of their own, instead of joining the torn bytes into a line no restart can read."""
    store = StateStore(tmp_path)
    store.save(PersistedState(tenants=[A]))
    store.record_grant(lease("w1", 1))
    with open(tmp_path / JOURNAL_FILE, "ab") as f:
        f.write(b'{"end": "w1", "se')
    again = StateStore(tmp_path)
    assert [x.lease_id for x in again.load().leases] == ["w1"]
    again.record_end("w1")
    again.record_grant(lease("w2", 2))
    loaded = restarted(tmp_path)
    assert [x.lease_id for x in loaded.leases] == ["w2"] and loaded.tokens == {"GPU-0": 2}


def test_a_whole_last_line_without_its_newline_is_ended_before_the_next_entry(tmp_path):
    store = StateStore(tmp_path)
    store.record_grant(lease("w1", 1))
    journal = tmp_path / JOURNAL_FILE
    journal.write_bytes(journal.read_bytes().rstrip(b"\n"))
    again = StateStore(tmp_path)
    again.load()
    again.record_end("w1")
    assert restarted(tmp_path).leases == []


@pytest.mark.parametrize(
    "snapshot",
    [
        "[]",
        '{"tokens": null}',
        '{"tenants": [{"tenant_id": "local/a"}]}',
        '{"leases": [{"lease_id": "w1"}]}',
        '{"tenants": [{"tenant_id": "local/a", "name": "a", "gpus": [], "weight": 3}]}',
        '{"journal_seq": 1e999}',
        '{"tokens": {"GPU-0": 1e999}}',
    ],
)
def test_a_snapshot_of_another_shape_is_refused_in_one_line_naming_it(tmp_path, snapshot):
    (tmp_path / state.STATE_FILE).write_text(snapshot)
    with pytest.raises(StateDirError, match=r"agent-state.json: not a state this agent wrote"):
        restarted(tmp_path)


def test_a_snapshot_from_a_newer_agent_is_refused_not_half_read(tmp_path):
    StateStore(tmp_path).save(PersistedState(tenants=[A]))
    data = json.loads((tmp_path / state.STATE_FILE).read_text())
    newer = state.STATE_FORMAT + 1
    (tmp_path / state.STATE_FILE).write_text(json.dumps(data | {"format": newer}))
    with pytest.raises(StateDirError, match=rf"agent-state.json is in state format {newer}, newer"):
        restarted(tmp_path)


def test_an_agent_rolled_back_takes_a_snapshot_it_loses_nothing_of_and_refuses_one_with_resumes(
    tmp_path, monkeypatch
):
    """An agent older than the resumes reads format 1 and would drop a `resumes` key unread."""
    resume = SavedResume("w2", "local/a", ("GPU-0",), revoked=("w1",))
    plain = tmp_path / "plain"
    StateStore(plain).save(PersistedState(tenants=[A], leases=[lease("w1", 1)]))
    kept = tmp_path / "kept"
    StateStore(kept).save(PersistedState(tenants=[A], resumes={"w2": resume}))
    assert restarted(kept).resumes == {"w2": resume}, "this agent reads back what it wrote"
    monkeypatch.setattr(state, "STATE_FORMAT", 1)  # the format check of the agent before
    assert json.loads((plain / state.STATE_FILE).read_text())["format"] == 1
    assert [x.lease_id for x in restarted(plain).leases] == ["w1"]
    with pytest.raises(StateDirError, match=r"agent-state.json is in state format 2, newer than"):
        restarted(kept)


@pytest.mark.parametrize(
    "entry",
    [
        '{"grant": {"lease_id": "w2"}, "seq": 2}',
        '{"quota": {"local/a": 1}, "seq": 2}',
        '{"grant": {"lease_id": "w2", "tenant_id": "local/a", "gpus": ["GPU-0"], "tokens": '
        '{"GPU-0": 1e999}, "granted_at": 1.0, "hold_until": 2.0}, "seq": 2}',
    ],
)
def test_a_journal_entry_of_another_shape_is_refused_with_its_line(tmp_path, entry):
    store = StateStore(tmp_path)
    store.record_grant(lease("w1", 1))
    with open(tmp_path / JOURNAL_FILE, "ab") as f:
        f.write(entry.encode() + b"\n")
    with pytest.raises(StateDirError, match=r"agent-journal.jsonl line 2: not an entry"):
        restarted(tmp_path)


def test_a_journal_line_numbered_past_any_integer_is_refused_with_its_line(tmp_path):
    store = StateStore(tmp_path)
    store.record_grant(lease("w1", 1))
    with open(tmp_path / JOURNAL_FILE, "ab") as f:
        f.write(b'{"end": "w1", "seq": 1e999}\n{"end": "w1", "seq": 3}\n')
    with pytest.raises(StateDirError, match=r"agent-journal.jsonl line 2: cannot convert"):
        restarted(tmp_path)


def test_the_fair_lags_round_trip_and_a_state_file_without_them_loads(tmp_path):
    lags = FairLags(
        tenants=[Lag("local/a", 5.0, 0, ("GPU-0",))],
        departed=[Lag("local/b", 2.0, 10, ("GPU-0",))],
        balance={("GPU-0", 0): 1.5},
    )
    StateStore(tmp_path / "kept").save(PersistedState(tenants=[A], fair=lags))
    assert restarted(tmp_path / "kept").fair == lags
    StateStore(tmp_path / "none").save(PersistedState(tenants=[A]))
    data = json.loads((tmp_path / "none" / state.STATE_FILE).read_text())
    assert "fair" not in data and data["format"] == 1, "as an agent before them wrote it"
    assert restarted(tmp_path / "none").fair == FairLags()
