"""The fair policy's clocks, carried from one leader to the next in the Lease itself.

The arbiter's fair policy (`agent.core.fair.FairShare`) orders jobs by their virtual time; a new
leader that started it afresh would forget who has had the GPUs. So the leader writes the
clocks as an annotation of its Lease with each renewal (no write of its own: the renewal is one
anyway) and the next leader reads them from the Lease it takes over. What a renewal carries is
at most one renewal period old. The API server refuses a Lease whose annotations pass 256 KiB
(and with it every renewal), so what is carried is bounded (`MAX_BYTES`): past it, the jobs that
hold and wait for nothing and are furthest behind are left out (one that comes back starts at its
GPUs' clock, as a new job does, losing at most the credit it had banked).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from agent.core.leases import LeaseTable

log = logging.getLogger(__name__)

MAX_BYTES = 128 * 1024
"""The most the clocks take of the Lease's annotations (the API server takes 256 KiB in all)."""
_too_big = [False]
"""Whether the clocks were found too big even without the idle jobs (said once)."""


def dump(table: LeaseTable, limit: int = MAX_BYTES) -> str:
    """The table's fair clocks as JSON of at most `limit` bytes ("" under another policy, or
    if even the GPUs' clocks and the jobs holding or waiting do not fit: said once)."""
    fair = table.fair
    if fair is None:
        return ""
    vtime = dict(fair.vtime)
    text = _text(vtime, fair.vclock, fair.balance)
    excess = len(text.encode()) - limit
    if excess <= 0:
        return text
    active = {x.tenant_id for x in table.leases.values()}
    active |= {x.tenant_id for x in table.waiters.values()}
    for job in sorted(vtime.keys() - active, key=lambda job: vtime[job]):  # furthest behind first
        excess -= len(json.dumps({job: vtime.pop(job)}, separators=(",", ":")).encode()) - 1
        if excess <= 0 and len((text := _text(vtime, fair.vclock, fair.balance)).encode()) <= limit:
            return text
    if not _too_big[0]:
        log.error(
            "the fair clocks (%d GPUs, %d jobs holding or waiting) do not fit in %d bytes of the "
            "Lease: the next leader takes up older ones", len(fair.vclock), len(vtime), limit,
        )  # fmt: skip
        _too_big[0] = True
    return ""


def _text(
    vtime: dict[str, float], vclock: dict[str, float], balance: dict[tuple[str, int], float]
) -> str:
    state: dict[str, Any] = {
        "vtime": vtime,
        "vclock": vclock,
        "balance": [[gpu, tier, owed] for (gpu, tier), owed in sorted(balance.items())],
    }
    return json.dumps(state, sort_keys=True, separators=(",", ":"))


def load(table: LeaseTable, text: str) -> bool:
    """Take up clocks `dump` wrote; False (said in the log) if there are none or they are
    unreadable: the policy then starts afresh."""
    fair = table.fair
    if fair is None or not text:
        return False
    try:
        state = json.loads(text)
        vtime = {str(k): float(v) for k, v in state["vtime"].items()}
        vclock = {str(k): float(v) for k, v in state["vclock"].items()}
        balance = {(str(g), int(t)): float(v) for g, t, v in state["balance"]}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.error("the fair clocks in the Lease are unreadable (%s): starting afresh", exc)
        return False
    fair.vtime.update(vtime)
    fair.vclock.update(vclock)
    fair.balance.update(balance)
    return True
