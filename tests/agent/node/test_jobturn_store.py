"""The job turns an agent keeps across its restarts: appended lines, the last whole one wins."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from agent.node import jobturn_store
from agent.node.jobturn_store import TURNS_FILE, JobTurnStore


def turn(turn_id: str) -> dict[str, object]:
    return {"turn_id": turn_id, "job": "rl"}


def test_each_change_is_a_line_and_a_new_store_loads_the_last(tmp_path: Path) -> None:
    store = JobTurnStore(tmp_path)
    store.save_turns([turn("t1")])
    store.save_turns([turn("t1"), turn("t2")])
    store.save_turns([turn("t2")])
    assert len((tmp_path / TURNS_FILE).read_text().splitlines()) == 3
    store.close()
    assert JobTurnStore(tmp_path).load_turns() == [turn("t2")]


def test_a_line_a_crash_cut_short_is_skipped_and_never_appended_to(tmp_path: Path) -> None:
    store = JobTurnStore(tmp_path)
    store.save_turns([turn("t1")])
    store.close()
    with open(tmp_path / TURNS_FILE, "a") as out:
        out.write('{"turns": [{"turn_id": "t2"')  # the agent died inside this write
    again = JobTurnStore(tmp_path)
    assert again.load_turns() == [turn("t1")]
    again.save_turns([turn("t3")])  # the first save after a start rewrites the file
    again.save_turns([turn("t3"), turn("t4")])
    again.close()
    lines = (tmp_path / TURNS_FILE).read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"turns": [turn("t3")]},
        {"turns": [turn("t3"), turn("t4")]},
    ]


def test_the_file_is_cut_back_to_its_last_line_when_it_grows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobturn_store, "TURNS_COMPACT_BYTES", 200)
    store = JobTurnStore(tmp_path)
    for i in range(50):
        store.save_turns([turn(f"t{i}")])
        assert (tmp_path / TURNS_FILE).stat().st_size <= 200
    store.close()
    assert JobTurnStore(tmp_path).load_turns() == [turn("t49")]


def test_a_file_of_one_json_object_loads_as_before(tmp_path: Path) -> None:
    (tmp_path / TURNS_FILE).write_text(json.dumps({"turns": [turn("t1")]}))
    assert JobTurnStore(tmp_path).load_turns() == [turn("t1")]


def test_a_file_with_no_whole_record_restores_nothing_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / TURNS_FILE).write_text("not json\n")
    with caplog.at_level(logging.ERROR):
        assert JobTurnStore(tmp_path).load_turns() == []
    assert "holds no whole record" in caplog.text


def test_a_write_that_fell_short_is_not_appended_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JobTurnStore(tmp_path)
    store.save_turns([turn("t1")])
    real_write = os.write

    def half(fd: int, data: bytes) -> int:
        return real_write(fd, data[: len(data) // 2])  # the disk filled up part-way

    monkeypatch.setattr(jobturn_store.os, "write", half)
    with pytest.raises(OSError, match=r"only .* bytes written"):
        store.save_turns([turn("t2")])
    monkeypatch.setattr(jobturn_store.os, "write", real_write)
    store.save_turns([turn("t3")])  # rewrites the file whole
    store.close()
    assert JobTurnStore(tmp_path).load_turns() == [turn("t3")]
