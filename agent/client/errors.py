"""Errors the client library raises; each says what happened and what to do."""

from __future__ import annotations

import grpc


class BatonError(Exception):
    """Base class of the client's errors."""


class AgentUnavailable(BatonError, ConnectionError):
    """The agent cannot be reached (not running, restarting, wrong socket)."""


class AcquireTimeout(BatonError, TimeoutError):
    """No turn within the timeout; the request has left the agent's queue."""


class PermissionDenied(BatonError, PermissionError):
    """The agent refused: the lease or GPU is another tenant's."""


class Refused(BatonError):
    """The agent refused in the tenant's current state (not registered, already holding...)."""


class NotHolding(Refused):
    """Yield or renew without a turn."""


class LeaseLost(BatonError):
    """The lease is gone (revoked, or dropped while the agent restarted)."""


class InvalidRequest(BatonError, ValueError):
    """The agent rejected the request's arguments (e.g. GPUs the tenant was not given)."""


def from_rpc_error(exc: grpc.aio.AioRpcError | grpc.RpcError, socket: str) -> BatonError:
    """The client error for a failed RPC."""
    code = exc.code() if hasattr(exc, "code") else None
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    kinds: dict[grpc.StatusCode, type[BatonError]] = {
        grpc.StatusCode.DEADLINE_EXCEEDED: AcquireTimeout,
        grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
        grpc.StatusCode.FAILED_PRECONDITION: Refused,
        grpc.StatusCode.NOT_FOUND: LeaseLost,
        grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
    }
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return AgentUnavailable(f"lost the Baton agent at {socket}: {detail}")
    return kinds.get(code, BatonError)(detail or str(code))
