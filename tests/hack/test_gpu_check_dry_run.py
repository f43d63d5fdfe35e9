"""`hack/gpu-check.sh --dry-run`: the GPU check's every step that needs no GPU, in a Python 3.12
environment made of the lent machine's packages (hack/gpu-check/image-packages.txt) plus the
wheels it carries (hack/gpu-check/wheels.txt), against stand-ins of the driver libraries. A
missing wheel, a wrong import or a bad path fails here rather than in the lent minutes.

The environment and the wheels are built once per version of those lists, under
~/.cache/baton/gpu-check (PyPI the first time), and reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LISTS = ROOT / "hack" / "gpu-check"
DEVICE_RUN_S = 450
"""What one run of the check may take on the lent machine: half its 15 minutes of device time
(one start included), so that a rerun fits."""
CACHE = Path(os.environ.get("BATON_GPU_CHECK_CACHE", Path.home() / ".cache/baton/gpu-check"))


def python312() -> str | None:
    """A CPython 3.12 interpreter that runs: one of pyenv's, or python3.12 on PATH."""
    pyenv = sorted(Path("/root/.pyenv/versions").glob("3.12.*/bin/python3.12"), reverse=True)
    for candidate in [*map(str, pyenv), shutil.which("python3.12")]:
        if candidate is None:
            continue
        probe = [candidate, "-c", "import sys; print(sys.version_info[:2] == (3, 12))"]
        ran = subprocess.run(probe, capture_output=True, text=True, timeout=30)
        if ran.stdout.strip() == "True":
            return candidate
    return None


def prepared(python: str) -> tuple[Path, Path]:
    """The image-like virtual environment and the carried wheels, built if not cached."""
    lists = (LISTS / "image-packages.txt").read_bytes() + (LISTS / "wheels.txt").read_bytes()
    home = CACHE / hashlib.sha256(lists).hexdigest()[:16]
    venv, wheels = home / "venv", home / "wheels"
    if not (home / "ready").exists():
        shutil.rmtree(home, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
        pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "-r", str(LISTS / "image-packages.txt")], check=True, timeout=600)
        subprocess.run([str(LISTS / "fetch-wheels.sh"), str(wheels)], check=True, timeout=300)
        (home / "ready").write_text("")
    return venv, wheels


@pytest.mark.timeout(900)
def test_the_gpu_check_passes_its_dry_run(tmp_path: Path) -> None:
    python = python312()
    if python is None:
        pytest.skip("needs Python 3.12 (python3.12 on PATH, or pyenv's)")
    for tool in ("gcc", "unshare", "mount", "timeout"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs system package providing {tool}")
    if os.geteuid() != 0:
        pytest.skip("needs root (the check makes cgroups and may mount cgroup2)")
    venv, wheels = prepared(python)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))},
        "PYTHON": str(venv / "bin/python"), "WHEELS": str(wheels), "OUT": str(tmp_path),
        "BUDGET_S": "300", "PORT": str(19460 + os.getpid() % 500),
    }  # fmt: skip
    done = subprocess.run(
        ["bash", str(ROOT / "hack/gpu-check.sh"), "--dry-run"],
        env=env, capture_output=True, text=True, timeout=330,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    # one file by default: the lent machine hands back at most 8 files from $OUT
    assert [p.name for p in tmp_path.iterdir()] == ["gpu-check.tar.gz"]
    shutil.unpack_archive(tmp_path / "gpu-check.tar.gz", tmp_path / "unpacked")
    logs = tmp_path / "unpacked" / "gpu-check"
    versions = json.loads((logs / "versions.json").read_text())
    assert versions["python"].startswith("3.12") and versions["cuda-bindings"] == "13.0.3"
    assert str(wheels) not in versions["grpc from"] and "/site/" in versions["grpc from"]
    evidence = json.loads((logs / "evidence.json").read_text())
    assert evidence["parks"] >= evidence["switches"] >= 2
    assert all(evidence["saw_peer_parked"].values()) and evidence["restarted_agent_restored"]
    cuda = json.loads((logs / "cuda.json").read_text())
    assert cuda["parks"] >= 2 and cuda["out_gbps"] and cuda["in_gbps"]
    for log in ("check.log", "agent1.log", "agent2.log", "standin-cuda.log"):
        assert (logs / log).stat().st_size > 0, log


def test_the_check_bounded_by_default_ends_with_its_cleanup_within_half_the_device_time() -> None:
    script = (ROOT / "hack/gpu-check.sh").read_text()

    def number(pattern: str) -> int:
        found = re.search(pattern, script)
        assert found, pattern
        return int(found.group(1))

    budget = number(r"(?m)^BUDGET_S=\$\{BUDGET_S:-(\d+)\}")
    assert 'timeout --kill-after="$KILL_AFTER_S" "$BUDGET_S"' in script
    kill_after = number(r"(?m)^KILL_AFTER_S=(\d+)")
    assert "local end=$((SECONDS + CLEANUP_S))" in script
    cleanup = number(r"(?m)^CLEANUP_S=(\d+)")
    assert budget + kill_after + cleanup <= DEVICE_RUN_S - 5  # tar and rm after it
