"""The agent's clock: wall-clock seconds that never step while the agent runs.

Turns are timed on it (grants, `--max-hold`, acquire deadlines, duty and accounting) and their
times are saved in the agent's state, so it must read as wall time: an agent that restarts
compares the saved grant times with its own now. But the wall clock itself steps (NTP, an
operator's `date`): read directly, a step forward revokes every turn held, a step back
stretches every hold and deadline by its size. So the wall clock is read once, at start, and
the monotonic clock counts from there; a step is taken up at the next start.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def steady_wall_clock(
    wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic
) -> Callable[[], float]:
    """A clock reading the wall time at its making plus the monotonic time since."""
    offset = wall() - monotonic()
    return lambda: offset + monotonic()
