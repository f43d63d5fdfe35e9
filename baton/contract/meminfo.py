"""The host's memory as /proc/meminfo reports it (the parked-memory budgets start from it)."""

from __future__ import annotations

MEMINFO = "/proc/meminfo"


def mem_total_kib(text: str) -> int:
    """MemTotal from /proc/meminfo's text, KiB; `ValueError` if it has no such line."""
    return _field_kib(text, "MemTotal")


def mem_available_kib(text: str) -> int:
    """MemAvailable from /proc/meminfo's text (what can be taken without swapping), KiB;
    `ValueError` if it has no such line."""
    return _field_kib(text, "MemAvailable")


def _field_kib(text: str, name: str) -> int:
    for line in text.splitlines():
        if line.startswith(f"{name}:"):
            return int(line.split()[1])
    raise ValueError(f"{MEMINFO} has no {name} line")
