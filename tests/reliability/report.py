"""Write docs/reliability.md from the figures the reliability tests recorded.

python -m tests.reliability.report FIGURES.jsonl[=RUN] ... --out docs/reliability.md [--note TEXT]

Each figures file is one run; with more than one, every row says which run it came from (RUN,
e.g. "make soak, 2026-11-30"), and a row a later file records again replaces the earlier one.
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


Rows = dict[str, list[tuple[str, str, dict[str, Any]]]]
"""Per section: (what, run, figures), in the order recorded."""


def load(path: Path, run: str = "", into: Rows | None = None) -> Rows:
    """The recorded figures by section; a name recorded again replaces its earlier row."""
    by_section: Rows = into if into is not None else {s: [] for s in SECTIONS}
    for line in path.read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            rows = by_section.setdefault(entry["section"], [])
            rows[:] = [r for r in rows if r[0] != entry["name"]]
            rows.append((entry["name"], run, entry["figures"]))
    return by_section


def table(rows: list[tuple[str, str, dict[str, Any]]], with_runs: bool) -> list[str]:
    """A markdown table: one row per recorded result, its figures as `name: value`."""
    out = ["| what | run | figures |", "|---|---|---|"] if with_runs else []
    out = out or ["| what | figures |", "|---|---|"]
    for name, run, figures in rows:
        cells = ", ".join(f"{k}: {v}" for k, v in figures.items()).replace("|", "/")
        out.append(f"| {name} | {run} | {cells} |" if with_runs else f"| {name} | {cells} |")
    return out


def render(by_section: Rows, note: str) -> str:
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
    with_runs = len({run for rows in by_section.values() for _, run, _ in rows}) > 1
    for key, title in SECTIONS.items():
        rows = by_section.get(key, [])
        lines += [f"## {title}", ""]
        lines += table(rows, with_runs) if rows else ["(nothing recorded)"]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("figures", nargs="+", help="FIGURES.jsonl or FIGURES.jsonl=RUN")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--note", default="")
    args = p.parse_args()
    rows: Rows = {s: [] for s in SECTIONS}
    for given in args.figures:
        path, _, run = given.partition("=")
        load(Path(path), run, rows)
    args.out.write_text(render(rows, args.note))


if __name__ == "__main__":
    main()
