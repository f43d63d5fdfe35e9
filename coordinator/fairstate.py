"""The fair policy's clocks, carried from one leader to the next in the Lease itself.

The arbiter's fair policy (`agent.core.fair.FairShare`) orders jobs by their virtual time; a new
leader that started it afresh would forget who has had the GPUs. So the leader writes the
clocks as an annotation of its Lease with each renewal (no write of its own: the renewal is one
anyway) and the next leader reads them from the Lease it takes over. What a renewal carries is
at most one renewal period old.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from agent.core.leases import LeaseTable

log = logging.getLogger(__name__)


def dump(table: LeaseTable) -> str:
    """The table's fair clocks as JSON ("" under another policy)."""
    fair = table.fair
    if fair is None:
        return ""
    state: dict[str, Any] = {
        "vtime": fair.vtime,
        "vclock": fair.vclock,
        "balance": [[gpu, tier, owed] for (gpu, tier), owed in sorted(fair.balance.items())],
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
