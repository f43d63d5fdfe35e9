"""A tenant process's reports: one JSON object a line on its stdout."""

from __future__ import annotations

import asyncio
import json
from typing import Any


async def read_line(proc: asyncio.subprocess.Process, timeout: float) -> dict[str, Any]:
    """The next JSON line of a tenant, or a description of its end."""
    assert proc.stdout is not None
    try:
        raw = await asyncio.wait_for(proc.stdout.readline(), timeout)
    except TimeoutError:
        return {"event": "error", "error": f"said nothing for {timeout:g} s"}
    if not raw:
        try:
            status = await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            status = None
        return {"event": "error", "error": f"closed its output (exit status {status})"}
    data = json.loads(raw)
    return data if isinstance(data, dict) else {"event": "error", "error": repr(data)}
