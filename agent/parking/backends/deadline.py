"""Driver calls with a deadline: each runs in a thread of its own, and the caller stops waiting.

A driver call cannot be cancelled. One that does not return in time is left running in its
(daemon) thread and reported as `CallStalled`; the backend quarantines the tenant it was for, or
(a lock) undoes what the call does once it returns (`CallStalled.on_return`).
A deadline past what a thread can wait (`threading.TIMEOUT_MAX`, about 292 years: an infinite
`--driver-call-timeout`) waits that long.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from threading import Lock
from typing import Any, TypeVar

from agent.parking.backends.base import BackendError

log = logging.getLogger(__name__)

T = TypeVar("T")


class InFlight:
    """A driver call's thread: what runs once the call has returned."""

    def __init__(self) -> None:
        self._mutex = Lock()
        self._returned = False
        self._then: list[Callable[[], None]] = []

    def on_return(self, fn: Callable[[], None]) -> bool:
        """Run `fn` in the call's thread once the call returns; False (not run) if it has."""
        with self._mutex:
            if not self._returned:
                self._then.append(fn)
            return not self._returned

    def returned(self) -> None:
        with self._mutex:
            self._returned = True
            then, self._then = self._then, []
        for fn in then:
            try:
                fn()
            except Exception:  # nobody waits for this thread any more: said, not raised
                log.exception("after a driver call that returned late")


class CallStalled(BackendError):
    """A driver call did not return within its deadline; it may still be running."""

    def __init__(self, message: str, call: InFlight | None = None) -> None:
        super().__init__(message)
        self.call = call

    def on_return(self, fn: Callable[[], None]) -> bool:
        """Run `fn` once the stalled call returns (in its thread); False if it returned already
        (or is not known), and `fn` is not run."""
        return self.call is not None and self.call.on_return(fn)


def call_with_deadline(seconds: float, what: str, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`, or `CallStalled` naming `what` if it has not returned after `seconds`."""
    box: dict[str, Any] = {}
    done = threading.Event()
    call = InFlight()

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # handed to the caller below
            box["error"] = e
        finally:
            done.set()
            call.returned()

    threading.Thread(target=run, name=f"driver-call {what}", daemon=True).start()
    if not done.wait(min(seconds, threading.TIMEOUT_MAX)):
        raise CallStalled(f"{what} did not return within {seconds:g} s", call)
    if "error" in box:
        raise box["error"]
    return box["value"]
