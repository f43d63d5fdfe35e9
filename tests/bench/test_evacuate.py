"""`baton bench evacuate`: its flags, and the room its bytes need, checked before anything is
written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from baton.contract.names import MIB
from commands.bench import evacuate
from commands.cli import app


def _evacuate(*args: str) -> Any:
    return CliRunner().invoke(app, ["bench", "evacuate", *args], terminal_width=200)


def _ours() -> set[str]:
    return {n for n in os.listdir(evacuate.fake_dir()) if n.startswith("baton-evacuate-")}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--size-mib", "0"], "--size-mib 0: give 1 MiB or more"),
        (["--size-mib", "-5"], "--size-mib -5: give 1 MiB or more"),
        (["--runs", "0"], "--runs 0: give 1 run or more"),
    ],
)
def test_a_count_of_nothing_is_refused_naming_its_flag(args: list[str], says: str) -> None:
    result = _evacuate(*args)
    assert result.exit_code == 2, result.output
    assert result.output == f"baton bench evacuate: {says}\n"


def test_a_region_its_park_cannot_hold_twice_is_refused_before_a_byte_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = _ours()
    usage = shutil.disk_usage(evacuate.fake_dir())
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=7 * MIB))
    result = _evacuate("--size-mib", "4", "--runs", "1")
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"baton bench evacuate: --size-mib 4: a park holds the region twice (8 MiB) and "
        f"{evacuate.fake_dir()} has 7 MiB free\n"
    )
    assert _ours() == before


def test_a_region_the_plain_copies_cannot_hold_twice_in_memory_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  65536 kB\nMemFree:  8192 kB\nMemAvailable:  7168 kB\n")
    monkeypatch.setattr(evacuate, "MEMINFO", str(meminfo))
    before = _ours()
    result = _evacuate("--size-mib", "4", "--runs", "1")
    assert result.exit_code == 2, result.output
    assert result.output == (
        "baton bench evacuate: --size-mib 4: the plain copies hold the region twice (8 MiB) and "
        "the machine has 7 MiB of memory available\n"
    )
    assert _ours() == before


def test_a_region_with_room_is_parked_restored_and_copied_with_every_field() -> None:
    before = _ours()
    result = _evacuate("--size-mib", "4", "--runs", "1", "--json")
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert (figures["backend"], figures["bytes"], figures["runs"]) == ("fake", 4 * MIB, 1)
    for field in ("out_gbps", "in_gbps", "memcpy_gbps", "memcpy_touched_gbps"):
        assert figures[field] > 0, field
    assert _ours() == before
