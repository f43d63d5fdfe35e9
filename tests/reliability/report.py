"""Write docs/reliability.md from the figures the reliability tests recorded.

python -m tests.reliability.report FIGURES.jsonl docs/reliability.md [--note TEXT]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

SECTIONS = {
    "load": "Load held",
    "faults": "Faults survived",
    "bad-input": "Bad inputs tried",
    "security": "Security checks",
}


def load(path: Path) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """The recorded figures by section, in the order they were recorded."""
    by_section: dict[str, list[tuple[str, dict[str, Any]]]] = {s: [] for s in SECTIONS}
    for line in path.read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            by_section.setdefault(entry["section"], []).append((entry["name"], entry["figures"]))
    return by_section


def table(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """A markdown table: one row per recorded result, its figures as `name: value`."""
    out = ["| what | figures |", "|---|---|"]
    for name, figures in rows:
        cells = ", ".join(f"{k}: {v}" for k, v in figures.items())
        out.append(f"| {name} | {cells.replace('|', '/')} |")
    return out


def render(by_section: dict[str, list[tuple[str, dict[str, Any]]]], note: str) -> str:
    """The whole document."""
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Reliability figures",
        "",
        f"Generated on {when} by `tests/reliability/report.py` from the figures the tests in",
        "`tests/reliability` recorded; `make soak` runs them all, long ones included, and",
        "regenerates this file. Do not edit by hand.",
        "",
    ]
    if note:
        lines += [f"> {note}", ""]
    for key, title in SECTIONS.items():
        rows = by_section.get(key, [])
        lines += [f"## {title}", ""]
        lines += table(rows) if rows else ["(nothing recorded)"]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("figures", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--note", default="")
    args = p.parse_args()
    args.out.write_text(render(load(args.figures), args.note))


if __name__ == "__main__":
    main()
