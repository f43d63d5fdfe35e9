"""Calls made again while the node agent restarts under them.

A call in flight when the agent restarts fails with `AgentUnavailable`, and so does one made while
the client is still reconnecting (each waits the client's connect timeout); the tenant keeps its
turn and its place is asked for again, so making the same call again is what a tenant should do
(docs/client.md, Sessions).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from agent.client.errors import AgentUnavailable

T = TypeVar("T")

AGENT_RESTART_WAIT_S = 120.0
"""How long a call is retried while the agent restarts under it (a DaemonSet's pod is replaced
in seconds, more when its image must be pulled); the client reconnects on its own."""


def across_agent_restarts(
    call: Callable[[], T],
    wait_s: float = AGENT_RESTART_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> T:
    """`call()`, made again while the agent is away, for up to `wait_s` seconds; past them the
    last `AgentUnavailable` is raised: it says why."""
    deadline = clock() + wait_s
    while True:
        try:
            return call()
        except AgentUnavailable:
            if clock() >= deadline:
                raise
            pause(0.1)  # a call refused at once (e.g. mid-handshake) is not retried in a spin
