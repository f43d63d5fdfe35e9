"""The asyncio client's kept lease, given back from a thread when the caller's event loop cannot.

`AsyncBaton` gives a kept lease back from a timer on its loop (`agent.client.timers.LoopTimer`).
A caller that does synchronous work between turns (a torch call, a data loader, logging) blocks
that loop, and the timer with it: the lease would stay kept, the GPU idle while others wait, for
as long as the work takes. So a thread (`Keeper`) watches the same deadline, `GRACE_S` later, and
gives the lease back itself over a call link (`agent.client.call_link`: a connection of its own,
read by that thread) if the loop has not. The core's kept state is changed under one lock by
both; an `acquire` on the loop waits for the thread's yield to be answered (`released`) before
it asks, so the agent reads the yield first.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from agent.client.call_link import CallLink, NotSent
from agent.client.errors import AgentUnavailable, BatonError
from agent.client.session_core import SessionCore
from agent.client.timers import Keeper
from agent.client.types import REPLY_TIMEOUT_S
from baton._pb import agent_pb2 as pb

log = logging.getLogger("baton.client")

GRACE_S = 0.005
"""How long past the kept lease's deadline the loop's own timer has before the thread steps in."""


class KeptBackstop:
    """Gives the kept lease back from a thread once its deadline and `GRACE_S` have passed."""

    def __init__(
        self,
        core: SessionCore,
        lock: threading.Lock,
        socket: str,
        token: Callable[[], str],
        on_loop: Callable[[], None],
    ) -> None:
        """`lock` guards the core's kept state, `token()` is the session's now, and `on_loop`
        gives the lease back from the loop (called thread-safe where the thread could not)."""
        self._core, self._lock, self._socket, self._token = core, lock, socket, token
        self._on_loop = on_loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._link: CallLink | None = None
        self._keeper = Keeper(self._deadline, self._give_back, core.clock)
        self.released = threading.Event()
        """Clear while the thread's yield of a kept lease waits for its answer."""
        self.released.set()

    def poke(self) -> None:
        """A lease was kept (on the loop): watch its deadline."""
        self._loop = asyncio.get_running_loop()
        self._keeper.poke()

    @property
    def started(self) -> bool:
        """Whether its thread runs (a lease was kept once)."""
        return self._keeper.started

    def close(self) -> None:
        """Stop the thread (blocks while a yield it sends waits for its answer)."""
        self._keeper.close()
        if self._link is not None:
            self._link.close()

    def _deadline(self) -> float | None:
        with self._lock:
            due = self._core.kept_deadline()
        return None if due is None else due + GRACE_S

    def _give_back(self) -> None:
        with self._lock:
            release = self._core.kept_due()
            if release is None:  # taken back, given back by the loop, or not due yet
                return
            self.released.clear()
        try:
            self._send(release)
        except (AgentUnavailable, NotSent, OSError) as exc:
            log.info("could not give a kept turn back off the event loop (%s): the loop will", exc)
            with self._lock:
                self._core.undelivered = release
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._on_loop)
        except BatonError as exc:  # its lease ended meanwhile (a revocation): nothing to give
            log.debug("kept turn given back off the event loop: %s", exc)
        finally:
            self.released.set()

    def _send(self, release: pb.Request) -> None:
        token = self._token()
        link = self._link
        if link is None or link.closed or link.token != token:
            if link is not None:
                link.close()
            link = self._link = CallLink.open(self._socket, token, REPLY_TIMEOUT_S, self._core)
        link.call(release, REPLY_TIMEOUT_S)
