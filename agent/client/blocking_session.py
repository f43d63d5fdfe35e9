"""The blocking client's session: its lifecycle, the agent's messages, callbacks and renewals.

The session's socket and the background thread that reads it and reconnects after the agent
restarts are `agent.client.blocking_connection`'s; here are what the agent's messages (answers to
background requests, turns given back, revocations, park/restore callbacks) do, the held turn's
renewals and kept turns, decided in `agent.client.session_core`, and connecting and closing.
`agent.client.sync.Baton` adds the two calls.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import threading
import time
import weakref
from collections.abc import Callable, Sequence

from agent.client.background import BackgroundCall
from agent.client.blocking_connection import BlockingConnection
from agent.client.callback_runner import CLOSE_WAIT_S, CallbackRunner, CallbackTiming
from agent.client.connect import CLIENT_VERSION
from agent.client.errors import AgentUnavailable, BatonError
from agent.client.owner import SessionOwner
from agent.client.session_core import SessionCore
from agent.client.timers import Keeper
from agent.client.types import Callback, Identity, LeaseInfo, add_callbacks, timings_of
from baton._pb import agent_pb2 as pb


class BlockingSession(BlockingConnection):
    """A tenant's session with the node agent, served by a background thread."""

    def __init__(
        self,
        socket: str | None = None,
        gpus: Sequence[str] | str | None = None,
        *,
        name: str | None = None,
        gpu_memory_mib: int = 0,
        gpu_duty: int = 0,
        memory_limit_bytes: int = 0,
        priority: int = 0,
        on_park: Callback | None = None,
        on_restore: Callback | None = None,
        connect_timeout: float = 5.0,
        renew_interval: float = 2.0,
        reconnect: bool = True,
        job: str = "",
        park_at_yield: bool = True,
        keep_turns: bool = True,
    ) -> None:
        me = Identity.of(socket, gpus, name, gpu_memory_mib, gpu_duty, memory_limit_bytes, priority)
        connect_timeout, renew_interval = timings_of(connect_timeout, renew_interval)
        core = SessionCore(renew_interval)
        super().__init__(me.socket, connect_timeout, renew_interval, reconnect, core.ids)
        self.gpus, self.name = me.gpus, me.name
        self.job = job
        """The job whose turn `acquire` takes across its nodes ("": the pod's own, if any)."""
        self._registration = me.registration
        self._callbacks: dict[str, Callback] = {}
        self._core = core
        """The turn held and its renewal; changed only under `_state`."""
        self._core.park_at_yield = park_at_yield
        self._core.keeps_turns = keep_turns and not job  # a job's turn is the coordinator's
        self._keeper = Keeper(self._kept_deadline, self._give_back_due, self._core.clock)
        self._kept_released = threading.Event()
        """Clear while the yield of a kept lease travels on the session (`_yield_kept`)."""
        self._kept_released.set()
        self._owner = SessionOwner()
        self._connect_lock = threading.Lock()
        self._acquiring = threading.Lock()
        """One acquire at a time: one made while another thread's waits takes the same grant."""
        self._reader: threading.Thread | None = None
        self._callbacks_run = CallbackRunner(self._callbacks, self._answer)
        """Runs park/restore callbacks (on the reader thread; a restore a grant owes on the
        acquiring thread); closing waits for the one in flight."""
        self._core.parked = self._callbacks_run.parked.copy
        self.close_wait = CLOSE_WAIT_S
        """How long `close()` waits for a park or restore in flight."""
        self._at_exit = functools.partial(_close_at_exit, weakref.ref(self))
        self.register_callbacks(on_park=on_park, on_restore=on_restore)

    @property
    def lease(self) -> LeaseInfo | None:
        """The turn held now, if any (none once closed: the agent took it back)."""
        return None if self._closed.is_set() else self._core.lease

    @property
    def callback_timings(self) -> list[CallbackTiming]:
        """When the latest park/restore callbacks were read, ran and were answered."""
        return list(self._callbacks_run.timings)

    @property
    def resuming(self) -> bool:
        """True after a revocation, until the agent hands the turn back."""
        return self._core.resuming and not self._closed.is_set()

    def register_callbacks(
        self, on_park: Callback | None = None, on_restore: Callback | None = None
    ) -> None:
        """Callbacks the agent may ask for: move this tenant's memory off / back onto a GPU.

        Each gets the GPU UUID and returns the bytes it moved. Register before connecting.
        """
        add_callbacks(self._callbacks, self._reader is not None, on_park, on_restore)

    # Connection.

    def connect(self) -> None:
        """Open the session now (the first `acquire` does it otherwise)."""
        self._owner.check()  # (a forked child's copy: the parent's, or the parent's to open)
        self._owner.opened()  # before the lock: a child forked while it is held is told so
        with self._connect_lock:
            if self._closed.is_set():
                raise closed_error()
            if self._reader is not None:
                return
            reader = self._open()
            atexit.register(self._at_exit)
            self._reader = threading.Thread(
                target=self._supervise, args=(reader,), name="baton-client", daemon=True
            )
            self._reader.start()

    @property
    def opened(self) -> bool:
        """True once a session with the agent was opened and the client reconnects: an
        `AgentUnavailable` since means the agent went away (a restart the client reconnects
        through), not that it was never reached (nor that a `reconnect=False` client lost it)."""
        return self._reader is not None and self._reconnect

    def _hello(self) -> pb.Hello:
        """This tenant's registration, the callbacks it serves and whether it keeps turns."""
        return pb.Hello(
            client_version=CLIENT_VERSION,
            callbacks=sorted(self._callbacks),
            register=self._registration,
            keeps_turns=self._core.keeps_turns,
        )

    def _ready(self, wait: float) -> None:
        """Return once the session is open; `AgentUnavailable` if not within `wait` seconds, or
        at once the agent's refusal if it refuses the session for good (`Refusals`)."""
        if self._reader is None:
            self.connect()
        if self._connected.is_set():  # (the common case: no lock, no clock)
            return
        assert self._reader is not None
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            with self._state:
                if self._connected.is_set():
                    return
                refused = self._refusals.final()
            if refused is not None:
                raise refused
            if self._closed.is_set():
                raise closed_error()
            if not self._reconnect or not self._reader.is_alive():
                raise AgentUnavailable(
                    f"lost the Baton agent at {self.socket} and this client does not reconnect "
                    "(reconnect=False); create a new client"
                )
            if not self._answered.wait(max(0.0, deadline - time.monotonic())):
                with self._state:
                    raise self._refusals.still_reconnecting(wait)

    # Messages.

    def _on_message(self, message: pb.AgentMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind == "reply":
            self._on_reply(message.reply)
        elif kind == "callback":
            self._callbacks_run.run(message.callback, time.time())
        else:
            with self._state:
                self._yield_kept(self._core.pushed(message))

    def _on_reply(self, reply: pb.Reply) -> None:
        with self._state:
            call = self._calls.pop(reply.request_id, None)
        if call is not None:
            call.finish(reply)
            return
        release = self._core.unclaimed(reply)
        if release is not None:
            with contextlib.suppress(AgentUnavailable):
                self._send(pb.ClientMessage(request=release))

    def _answer(self, result: pb.CallbackResult) -> None:
        with contextlib.suppress(AgentUnavailable):
            self._send(pb.ClientMessage(callback_result=result))

    # Renewal (on the reader thread).

    def _renew_if_due(self) -> None:
        with self._state:
            lease = self._core.renewal_due()
        if lease is not None:
            self._renew(lease, reclaiming=False)

    def _reclaim(self) -> None:
        """After a reconnect: tell the new agent that the turn held is still in use."""
        with self._state:
            lease = self._core.reclaim()
            self._yield_kept(self._core.give_back())
        if lease is not None:
            self._renew(lease, reclaiming=True)

    # Kept turns (`agent.server.kept_turns`).

    def _kept_deadline(self) -> float | None:
        with self._state:
            return self._core.kept_deadline()

    def _give_back_due(self) -> None:
        with self._state:
            self._yield_kept(self._core.kept_due())

    def _yield_kept(self, release: pb.Request | None) -> None:
        """Yield a kept lease to the agent on the session, under `_state` (as the core gave it
        up): an `acquire` that finds nothing kept waits for its answer before it asks on the
        call link, another connection, which the agent might read first."""
        if release is None:
            return

        def done(call: BackgroundCall) -> None:
            if isinstance(call.error, AgentUnavailable):  # the session is down: after it is up
                with self._state:
                    self._core.undelivered = release
            self._kept_released.set()

        self._kept_released.clear()
        self._background(release, done)

    def _renew(self, lease: LeaseInfo, reclaiming: bool) -> None:
        def done(call: BackgroundCall) -> None:
            outcome: LeaseInfo | BatonError
            try:
                outcome = LeaseInfo.from_pb(call.result(self.socket).lease)
            except BatonError as exc:
                outcome = exc
            with self._state:
                self._core.renewed(lease, outcome, reclaiming)

        self._background(pb.Request(renew=pb.RenewRequest(lease_id=lease.lease_id)), done)

    def close(self) -> None:
        """End the session; the agent releases this process's turn and queue places.

        A park or restore in flight finishes (and is answered) first, up to `close_wait`
        seconds; callbacks asked for after this are refused. Runs at interpreter exit too.
        """
        self._closed.set()
        atexit.unregister(self._at_exit)
        if self._owner.forked():  # a forked child's copy: the parent's session goes on
            return
        self._keeper.close()
        inside = self._callbacks_run.running_here()  # (a callback of this client closes it)
        self._callbacks_run.close(self.close_wait)
        with self._state:
            sock = self._sock
        if sock is not None:
            self._lost(sock)
        reader = self._reader
        # Not from inside a callback: the reader may be waiting to run one after it (refused
        # once it ends), and ends once that one is answered.
        if reader is not None and reader is not threading.current_thread() and not inside:
            reader.join(timeout=5)

    def close_unless(self, keep: Callable[[], bool]) -> bool:
        """`close()`, unless `keep()` says otherwise (it is asked once no park or restore runs:
        one in flight finishes first, up to `close_wait` seconds, and none starts before the
        close); returns what `keep()` said. `BatonCallback.close()` leaves a process whose
        memory is parked open for a last turn that brings it back."""
        if self._owner.forked() or not self._callbacks_run.fence_unless(keep, self.close_wait):
            self.close()
            return False
        return True


def closed_error() -> BatonError:
    """What a call on a closed `Baton` raises, also one that close() cut off as it waited."""
    return BatonError("this Baton client is closed; create a new one")


def _close_at_exit(session: weakref.ref[BlockingSession]) -> None:
    """Close a session the program left open, so no callback runs while the interpreter ends."""
    if (live := session()) is not None:
        live.close()
