"""Figures the reliability tests measured, gathered for `docs/reliability.md`.

A test calls `record(section, name, figures)`; when $BATON_RELIABILITY_FIGURES names a file,
the figures are appended to it as JSON lines (`make soak` sets it, then runs
`tests.reliability.report`).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

ENV_FIGURES = "BATON_RELIABILITY_FIGURES"
_lock = threading.Lock()


def record(section: str, name: str, figures: dict[str, Any]) -> None:
    """Note one measured result (a load run, a fault survived, bad inputs tried)."""
    path = os.environ.get(ENV_FIGURES)
    if not path:
        return
    line = json.dumps({"section": section, "name": name, "figures": figures}, sort_keys=True)
    with _lock, open(path, "a") as f:
        f.write(line + "\n")


def turn_figures(lines: list[dict[str, Any]]) -> dict[str, int]:
    """What tenant processes' `turn` lines say they did: turns taken, turns that verified the
    previous turn's pattern, and the bytes of pattern they verified."""
    turns = [line for line in lines if line.get("event") == "turn"]
    verified = [line for line in turns if line.get("verified_bytes", 0) > 0]
    return {
        "turns": len(turns),
        "turns_verified": len(verified),
        "bytes_verified": sum(int(line["verified_bytes"]) for line in verified),
    }
