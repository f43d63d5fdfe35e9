"""The tenant-side client of the Baton node agent.

    from agent.client import Baton

    baton = Baton()            # BATON_AGENT_SOCKET, BATON_GPUS from the environment
    with baton.turn():
        train_step()

`AsyncBaton` offers the same for asyncio code.
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
