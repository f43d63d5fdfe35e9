"""How long a call with a deadline may wait before it answers: a little less than it has, so its
caller hears why it waited (a refusal's reason) instead of its own bare timeout."""

from __future__ import annotations

ANSWER_MARGIN_S = 0.25
"""Given up before the deadline (at most a tenth of the time left)."""


def answer_before(remaining: float | None) -> float | None:
    """The wait allowed to a call with `remaining` seconds left (None: no deadline)."""
    return None if remaining is None else max(0.0, remaining - min(ANSWER_MARGIN_S, remaining / 10))
