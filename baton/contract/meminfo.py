"""The host's memory as /proc/meminfo reports it (the parked-memory budgets start from it)."""

from __future__ import annotations

MEMINFO = "/proc/meminfo"


def mem_total_kib(text: str) -> int:
    """MemTotal from /proc/meminfo's text, KiB; `ValueError` if it has no such line."""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    raise ValueError(f"{MEMINFO} has no MemTotal line")
