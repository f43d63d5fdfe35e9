"""What the client hands out and takes in: leases, and the park/restore callbacks."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import math
import os
import socket as socketlib
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass

from agent.client.errors import BatonError, InvalidRequest
from baton._pb import agent_pb2 as pb
from baton.contract.names import (
    AGENT_SOCKET,
    ENV_AGENT_SOCKET,
    ENV_CLAIM_PREFIX,
    ENV_GPUS,
    ENV_TENANT_NAME,
)

log = logging.getLogger("baton.client")

Callback = Callable[[str], "int | Awaitable[int | None] | None"]


@dataclass(frozen=True)
class LeaseInfo:
    """A granted turn, as the client sees it."""

    lease_id: str
    gpus: tuple[str, ...]
    fencing_tokens: dict[str, int]
    granted_at: float
    hold_until: float
    contended: bool

    @classmethod
    def from_pb(cls, lease: pb.Lease) -> LeaseInfo:
        """From the wire form."""
        tokens = lease.fencing_tokens  # not dict(tokens): that runs the Python-level Mapping
        return cls(
            lease.lease_id,
            tuple(lease.gpus),
            {gpu: tokens[gpu] for gpu in tokens},
            lease.granted_at,
            lease.hold_until,
            lease.contended,
        )


def acquire_timeout(timeout: object) -> float | None:
    """An acquire's `timeout` in seconds, checked: None, inf or one past what a wait can count
    waits without end; anything but a number of seconds, 0 or more, is refused in one line."""
    if timeout is None:
        return None
    seconds = float(timeout) if isinstance(timeout, int | float) else math.nan
    if isinstance(timeout, bool) or not seconds >= 0:  # NaN too
        raise InvalidRequest(
            f"acquire timeout={timeout!r}: give seconds, 0 or more, or None to wait for the "
            "turn without end"
        )
    return None if seconds >= threading.TIMEOUT_MAX else seconds


def timings_of(connect_timeout: object, renew_interval: object) -> tuple[float, float]:
    """A client's `connect_timeout` and `renew_interval`, checked: finite numbers of seconds
    above 0, or `InvalidRequest` naming the one that is not (a socket's own error would not)."""
    checked = []
    for name, value in (("connect_timeout", connect_timeout), ("renew_interval", renew_interval)):
        seconds = float(value) if isinstance(value, int | float) else math.nan
        if isinstance(value, bool) or not 0 < seconds < math.inf:
            raise InvalidRequest(f"{name}={value!r}: give a finite number of seconds above 0")
        checked.append(seconds)
    return checked[0], checked[1]


def acquire_args(
    timeout: object, gpus: Sequence[str] | str | None
) -> tuple[float | None, tuple[str, ...] | None]:
    """An acquire's timeout, checked (`acquire_timeout`), and the GPUs it names (None: all the
    tenant's); a string is a comma-separated list, as in the constructor, never its letters."""
    return acquire_timeout(timeout), None if gpus is None else gpus_from(gpus)


@dataclass
class _TurnBlock:
    client: object
    open: bool = True


_OPEN_TURNS: contextvars.ContextVar[tuple[_TurnBlock, ...]] = contextvars.ContextVar(
    "baton_open_turns", default=()
)
"""The `turn()` blocks this thread (or task) is inside, outermost first."""


ENDED_BY_ERROR = "a turn block raised %s, and its turn could not be yielded: %s"
"""Logged, not raised, where a `turn()` block's yield fails as an error of its own leaves it:
the caller hears of the error the block raised."""


@contextlib.contextmanager
def turn_block(client: object) -> Iterator[Callable[[], bool]]:
    """Around a `turn()` block of `client`; gives `ends_turn`, called as the block ends: True
    unless a block of that client around it on this thread (or task, or the task that started
    it) is still open, whose end yields the turn (a `@baton.turn()` step called inside one)."""
    outer = _OPEN_TURNS.get()
    block = _TurnBlock(client)
    _OPEN_TURNS.set((*outer, block))

    def ends_turn() -> bool:
        block.open = False
        return not any(around.client is client and around.open for around in outer)

    try:
        yield ends_turn
    finally:
        block.open = False
        _OPEN_TURNS.set(outer)


REPLY_TIMEOUT_S = 10.0
"""How long a yield or renewal waits for the agent's answer (a live agent answers at once)."""


def reply_wait(request: pb.Request, timeout: float | None, slack: float) -> float | None:
    """How long to wait for the answer to `request`: its own timeout plus `slack`; without one,
    for ever for an acquire (it is queued), `REPLY_TIMEOUT_S` for anything else."""
    if timeout is not None:
        return timeout + slack
    return None if request.HasField("acquire") else REPLY_TIMEOUT_S


def time_left(request: pb.Request, left: float | None) -> pb.Request:
    """`request` about to go out with `left` seconds of its caller's timeout to spare (None: no
    timeout): an acquire's own timeout, which the agent keeps, is cut to that, so a wait for a
    reconnect before it left is not waited again in the queue."""
    if left is not None and request.HasField("acquire"):
        request.acquire.timeout_ms = max(1, int(left * 1000))
    return request


@dataclass(frozen=True)
class Identity:
    """Who a client says it is: its agent socket, its GPUs, its name and its registration."""

    socket: str
    gpus: tuple[str, ...]
    name: str
    registration: pb.RegisterRequest

    @classmethod
    def of(
        cls,
        socket: str | None,
        gpus: Sequence[str] | str | None,
        name: str | None,
        gpu_memory_mib: int,
        gpu_duty: int,
        memory_limit_bytes: int,
        priority: int = 0,
    ) -> Identity:
        """From the client's arguments, falling back on the environment."""
        path = socket or os.environ.get(ENV_AGENT_SOCKET) or AGENT_SOCKET
        wanted = gpus_from(gpus)
        default_name = f"{socketlib.gethostname()}-{os.getpid()}"
        chosen = name or os.environ.get(ENV_TENANT_NAME) or default_name
        registration = pb.RegisterRequest(
            name=chosen,
            gpus=wanted,
            gpu_memory_mib=gpu_memory_mib,
            gpu_duty=gpu_duty,
            memory_limit_bytes=memory_limit_bytes,
            priority=priority,
        )
        return cls(path, wanted, chosen, registration)


def add_callbacks(
    callbacks: dict[str, Callback],
    connected: bool,
    on_park: Callback | None,
    on_restore: Callback | None,
) -> None:
    """Register park/restore callbacks, which must come before the session opens."""
    if connected:
        raise BatonError("register callbacks before the first connect()/acquire()")
    for action, fn in (("park", on_park), ("restore", on_restore)):
        if fn is not None:
            callbacks[action] = fn


def gpus_from(value: Sequence[str] | str | None = None) -> tuple[str, ...]:
    """The GPUs given, or the container's: `BATON_GPUS` and each DRA claim's device GPUs (a
    container naming two claims keeps one claim's `BATON_GPUS`: CDI sets a variable once)."""
    if value is not None:
        items = value.split(",") if isinstance(value, str) else value
        return tuple(g.strip() for g in items if g.strip())
    found = [g.strip() for g in os.environ.get(ENV_GPUS, "").split(",") if g.strip()]
    for key in sorted(k for k in os.environ if k.startswith(f"{ENV_CLAIM_PREFIX}GPU_")):
        if (gpu := os.environ[key].strip()) and gpu not in found:
            found.append(gpu)
    return tuple(found)


def moved_bytes(request: pb.Callback, moved: object) -> int:
    """The bytes a callback that ran says it moved (None: 0). A value that is no number is
    logged and counted as 0: the callback ran, so its move stands; a park answered as failed
    would be forgotten here and never restored."""
    try:
        return int(moved or 0)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        log.warning(
            "on_%s(%s) returned %r, not the bytes it moved (an int, or None); counted as 0",
            request.action, request.gpu, moved,
        )  # fmt: skip
        return 0


async def run_callback(fn: Callback | None, request: pb.Callback) -> pb.CallbackResult:
    """Run a tenant's callback for the agent: sync ones in a thread; errors become the answer."""
    result = pb.CallbackResult(call_id=request.call_id)
    try:
        if fn is None:
            raise BatonError(f"no on_{request.action} callback registered")
        if inspect.iscoroutinefunction(fn):
            moved = await fn(request.gpu)
        else:
            moved = await asyncio.to_thread(fn, request.gpu)
        result.bytes = moved_bytes(request, moved)
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


def run_callback_blocking(fn: Callback | None, request: pb.Callback) -> pb.CallbackResult:
    """`run_callback` for the blocking client: runs in the caller's (a worker) thread."""
    result = pb.CallbackResult(call_id=request.call_id)
    try:
        if fn is None:
            raise BatonError(f"no on_{request.action} callback registered")
        moved = fn(request.gpu)
        if inspect.isawaitable(moved):
            moved = asyncio.run(_awaited(moved))
        result.bytes = moved_bytes(request, moved)
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def _awaited(value: Awaitable[int | None]) -> int | None:
    return await value
