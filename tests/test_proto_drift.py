"""The committed gRPC stubs are exactly what hack/gen-proto.sh makes from proto/.

Only the generator's version stamps may differ (a patch release of grpcio-tools).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "baton" / "_pb"
_STAMPS = [
    re.compile(r"^GRPC_GENERATED_VERSION = .*$", re.M),
    re.compile(r"^# Protobuf Python Version: .*$", re.M),
    re.compile(r"_runtime_version\.ValidateProtobufRuntimeVersion\([^)]*\)", re.S),
]


def _without_stamps(path: Path) -> str:
    text = path.read_text()
    for stamp in _STAMPS:
        text = stamp.sub("<version>", text)
    return text


def test_generated_stubs_match_protos(tmp_path: Path) -> None:
    out = tmp_path / "_pb"
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run(
        ["bash", str(ROOT / "hack" / "gen-proto.sh"), str(out)],
        check=True,
        env=env,
        timeout=120,
        capture_output=True,
    )
    generated = sorted(p.name for p in out.iterdir() if "_pb2" in p.name)
    committed = sorted(p.name for p in COMMITTED.iterdir() if "_pb2" in p.name)
    protos = sorted(ROOT.joinpath("proto").rglob("*.proto"))
    assert len(generated) == 3 * len(protos), "every .proto yields _pb2, _pb2_grpc and .pyi"
    assert generated == committed, "stubs missing or extra: run `make proto` and commit"
    stale = [n for n in generated if _without_stamps(out / n) != _without_stamps(COMMITTED / n)]
    assert not stale, f"stale generated stubs {stale}: run `make proto` and commit them"
