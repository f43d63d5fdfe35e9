"""The tenant-side client of the Baton node agent.

    from agent.client import Baton

    baton = Baton()            # BATON_AGENT_SOCKET, BATON_GPUS from the environment
    with baton.turn():
        train_step()

`AsyncBaton` offers the same for asyncio code. Both drive one state machine with no I/O,
`session_core.py` (the turn held, revocation and resume, renewal and reclaim, the yield's
rollback, late grants handed back); `sync.py`, `blocking_session.py`, `blocking_connection.py`
and `call_link.py` are the blocking shell, `aio.py`, `aio_session.py`, `aio_withdrawal.py`,
`connect.py` and `links.py` the asyncio one.
"""

from agent.client.aio import AsyncBaton
from agent.client.errors import (
    AcquireTimeout,
    AgentUnavailable,
    BatonError,
    InvalidRequest,
    LeaseLost,
    NotHolding,
    PermissionDenied,
    Refused,
)
from agent.client.sync import Baton
from agent.client.types import LeaseInfo

__all__ = [
    "AcquireTimeout",
    "AgentUnavailable",
    "AsyncBaton",
    "Baton",
    "BatonError",
    "InvalidRequest",
    "LeaseInfo",
    "LeaseLost",
    "NotHolding",
    "PermissionDenied",
    "Refused",
]
