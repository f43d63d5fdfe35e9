"""baton-client, the slim distribution for training images: it builds, and a venv with it and its
declared dependencies alone imports the client, with none of the daemons' dependencies."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
CLIENT = ROOT / "clients" / "python"
DAEMONS_ONLY = ("kubernetes", "uvloop", "httptools", "PIL", "typer", "rich", "yaml", "httpx")
PIP_TIMEOUT_S = 120


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--quiet", *args]
    subprocess.run(cmd, check=True, timeout=PIP_TIMEOUT_S, capture_output=True)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the wheel from a copy of clients/python beside links to the tree (the checkout
    stays free of build/)."""
    tree = tmp_path_factory.mktemp("tree")
    (tree / "clients").mkdir()
    subprocess.run(["cp", "-r", str(CLIENT), str(tree / "clients")], check=True)
    for package in ("agent", "baton"):
        (tree / package).symlink_to(ROOT / package)
    out = tmp_path_factory.mktemp("wheel")
    _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(tree / "clients/python"))
    (built,) = out.glob("baton_client-*.whl")
    return built


def test_the_wheel_holds_the_client_and_what_it_imports_only(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "agent/client/sync.py" in names and "baton/contract/framing.py" in names
    assert "baton/_pb/agent_pb2.py" in names and "baton/contract/names.py" in names
    daemons = ("agent/server/", "agent/core/", "commands/cli/", "extender/", "baton/contract/kube")
    assert not [n for n in names if n.startswith(daemons)]
    stubs = sorted(n for n in names if n.startswith("baton/_pb/"))
    assert [n.removeprefix("baton/_pb/") for n in stubs] == [
        "__init__.py",
        "agent_pb2.py",
        "agent_pb2.pyi",
        "agent_pb2_grpc.py",
    ]


def test_its_pins_are_baton_gpus() -> None:
    client = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    full = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(client["dependencies"]) <= set(full["dependencies"])
    for extra, pins in client["optional-dependencies"].items():
        assert pins == full["optional-dependencies"][extra], extra


def test_a_clean_venv_with_it_imports_the_client_and_nothing_of_the_daemons(
    wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    _pip("--python", python, "install", "--no-compile", str(wheel))
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "list", "--format=freeze"],
        check=True,
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
    ).stdout
    installed = {line.split("==")[0].lower().replace("_", "-") for line in listed.split()}
    assert installed == {"baton-client", "grpcio", "protobuf", "typing-extensions"}
    probe = (
        "import importlib.util, sys\n"
        "from agent.client import AsyncBaton, Baton, LeaseInfo\n"
        f"absent = [m for m in {DAEMONS_ONLY!r} if importlib.util.find_spec(m) is not None]\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('agent.server', 'agent.core')))\n"
        "print(Baton.__name__, AsyncBaton.__name__, absent, loaded)\n"
    )
    ran = subprocess.run(
        [python, "-I", "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["Baton", "AsyncBaton", "[]", "[]"]


def test_the_tenant_image_installs_the_slim_client_and_not_baton_gpu() -> None:
    text = (CLIENT / "Dockerfile").read_text()
    copies = [line.split() for line in text.splitlines() if line.startswith("COPY ")]
    copied = [words[1] for words in copies if not words[1].startswith("--from")]
    assert copied and all((ROOT / source).exists() for source in copied)
    assert 'pip install --no-cache-dir "./clients/python' in text
    assert "pyproject.toml" not in text.replace("clients/python", "")
