"""Driver calls with a deadline: each runs in a thread of its own, and the caller stops waiting.

A driver call cannot be cancelled. One that does not return in time is left running in its
(daemon) thread and reported as `CallStalled`; the backend quarantines the tenant it was for.
A deadline past what a thread can wait (`threading.TIMEOUT_MAX`, about 292 years: an infinite
`--driver-call-timeout`) waits that long.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from agent.parking.backends.base import BackendError

T = TypeVar("T")


class CallStalled(BackendError):
    """A driver call did not return within its deadline; it may still be running."""


def call_with_deadline(seconds: float, what: str, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`, or `CallStalled` naming `what` if it has not returned after `seconds`."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # handed to the caller below
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name=f"driver-call {what}", daemon=True).start()
    if not done.wait(min(seconds, threading.TIMEOUT_MAX)):
        raise CallStalled(f"{what} did not return within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]
