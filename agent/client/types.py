"""What the client hands out and takes in: leases, and the park/restore callbacks."""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from agent.client.errors import BatonError
from baton._pb import agent_pb2 as pb
from baton.names import ENV_GPUS

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
        return cls(
            lease.lease_id,
            tuple(lease.gpus),
            dict(lease.fencing_tokens),
            lease.granted_at,
            lease.hold_until,
            lease.contended,
        )


def gpus_from(value: Sequence[str] | str | None) -> tuple[str, ...]:
    raw = os.environ.get(ENV_GPUS, "") if value is None else value
    items = raw.split(",") if isinstance(raw, str) else raw
    return tuple(g.strip() for g in items if g.strip())


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
        result.bytes = int(moved or 0)
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
        result.bytes = int(moved or 0)
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def _awaited(value: Awaitable[int | None]) -> int | None:
    return await value
