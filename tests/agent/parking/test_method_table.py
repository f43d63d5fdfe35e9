"""The parking methods are listed once (`agent.parking.methods`): every method there builds, and
`--backend`, its help and the handoff bench's choices are the table's."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

import commands.cli
from agent.core.residency import NullPreparer
from agent.parking.backends import cuda as cuda_mod
from agent.parking.host import parking_of
from agent.parking.methods import CHOICES, METHODS, NONE, PLAIN, default_headroom
from agent.parking.setup import ParkingOptions, build_backend, build_preparer, parse_fake_gpus
from baton.contract.names import fake_gpu_uuid
from commands.bench.handoff import BACKENDS as BENCH_BACKENDS

from .standin_cuda import StandInDriver, StandInNvml


def _options(method: str, tmp_path: Path) -> ParkingOptions:
    return ParkingOptions(
        backend=method, fake_gpus="2x100", fake_dir=str(tmp_path), simulated_inventory=True
    )


@pytest.mark.parametrize("method", [m for m in CHOICES if m != NONE])
def test_every_method_in_the_table_builds_its_own_backend(
    method: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus = {fake_gpu_uuid(0): 100, fake_gpu_uuid(1): 100}
    driver = StandInDriver()
    monkeypatch.setattr(cuda_mod, "load_modules", lambda: (driver, StandInNvml(driver, gpus)))
    monkeypatch.setattr(cuda_mod, "bindings_version", lambda: "13.0.3")
    backend, built = build_backend(_options(method, tmp_path))
    assert backend.name == method and backend.methods() == (method,)
    assert backend.backend_for(method) is backend
    if not METHODS[method].measures_gpus:  # the node's inventory: here the simulated GPUs
        assert built == parse_fake_gpus("2x100")
    preparer = build_preparer(_options(method, tmp_path), backend=(backend, built))
    parking = parking_of(preparer)
    assert parking is not None and parking.methods() == (method,)
    backend.close()


def test_none_parks_nothing_and_the_server_sees_no_parking() -> None:
    assert METHODS[NONE].build is None
    preparer = build_preparer(ParkingOptions(backend=NONE))
    assert isinstance(preparer, NullPreparer) and parking_of(preparer) is None


def test_several_methods_route_through_one_backend_per_method(tmp_path: Path) -> None:
    backend, gpus = build_backend(_options("fake,app,endpoint", tmp_path))
    assert backend.methods() == ("fake", "app", "endpoint")
    assert [backend.backend_for(m).name for m in backend.methods()] == list(backend.methods())
    assert gpus == parse_fake_gpus("2x100")
    backend.close()


def test_the_headroom_each_method_wants_is_the_tables() -> None:
    real = {"GPU-0e9a7c52-0000-4a2b-9c1d-000000000001": 1}
    for method in CHOICES:
        wanted = METHODS[method].headroom
        expected = wanted(True) if wanted is not None else 0
        assert default_headroom(ParkingOptions(backend=method), real) == expected
    assert default_headroom(ParkingOptions(backend="app"), parse_fake_gpus("1x100")) == 0


def _command(*path: str) -> Any:
    command: Any = typer.main.get_command(commands.cli.app)
    for name in path:
        assert isinstance(command, typer.main.TyperGroup)
        command = command.commands[name]
    return command


def _listed(help_text: str) -> list[str]:
    """`Parking: none, fake, cuda, app or endpoint, or several`: the methods named, in order."""
    listed = re.search(r": ((?:\w+, )*\w+ or \w+)", help_text)
    assert listed, help_text
    return re.split(r", | or ", listed.group(1))


def _backend_help(command: Any) -> str:
    option = next(p for p in command.params if p.name == "backend")
    assert isinstance(option.help, str)
    return option.help


def test_the_agents_help_lists_exactly_the_tables_methods() -> None:
    assert _listed(_backend_help(_command("agent"))) == list(CHOICES)


def test_the_handoff_bench_offers_the_methods_that_need_nothing_configured() -> None:
    assert BENCH_BACKENDS == PLAIN == tuple(m for m in CHOICES if not METHODS[m].needs_target)
    assert _listed(_backend_help(_command("bench", "handoff"))) == list(PLAIN)


def test_an_unknown_backend_is_refused_in_one_line_naming_the_choices(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        commands.cli.app,
        ["agent", "--backend", "tpu", "--state-dir", f"{tmp_path}/state"],
        env={"BATON_AGENT_SOCKET": f"{tmp_path}/a.sock"},
    )
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--backend tpu: unknown backend 'tpu'" in lines[0]
    assert all(repr(m) in lines[0] for m in CHOICES)


def test_every_method_is_described_in_one_line_and_documented() -> None:
    page = (Path(__file__).resolve().parents[3] / "docs" / "agent.md").read_text()
    flag_row = next(line for line in page.splitlines() if line.startswith("| `--backend`"))
    for method in METHODS.values():
        assert method.description and "\n" not in method.description
        assert f"- **`{method.name}`**" in page, f"docs/agent.md does not describe {method.name}"
        assert f"`{method.name}`" in flag_row, f"the --backend row does not name {method.name}"
