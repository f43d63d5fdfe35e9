"""Errors the client library raises; each says what happened and what to do."""

from __future__ import annotations

import grpc


class BatonError(Exception):
    """Base class of the client's errors."""


class AgentUnavailable(BatonError, ConnectionError):
    """The agent cannot be reached (not running, restarting, wrong socket)."""


class AcquireTimeout(BatonError, TimeoutError):
    """No turn within the timeout; the request has left the agent's queue."""

    @property
    def reason(self) -> str:
        """Why it waited, as the agent last saw it (queue position, tier and share, or a
        refusal with its numbers); empty if the agent gave none."""
        return str(self).partition("it waited because ")[2]


class PermissionDenied(BatonError, PermissionError):
    """The agent refused: the lease or GPU is another tenant's."""


class Refused(BatonError):
    """The agent refused in the tenant's current state (not registered, already holding...)."""


class NotHolding(Refused):
    """Yield or renew without a turn."""


class LeaseLost(BatonError):
    """The lease is gone (revoked, or dropped while the agent restarted)."""


class TurnRevoked(LeaseLost):
    """The lease was revoked while the client could not hear it; its turn is being given back
    (the client resumes it, as after a revocation it heard)."""


class InvalidRequest(BatonError, ValueError):
    """The request's arguments are wrong (a negative timeout, GPUs the tenant was not given)."""


_KINDS: dict[grpc.StatusCode, type[BatonError]] = {
    grpc.StatusCode.DEADLINE_EXCEEDED: AcquireTimeout,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.FAILED_PRECONDITION: Refused,
    grpc.StatusCode.NOT_FOUND: LeaseLost,
    grpc.StatusCode.ABORTED: TurnRevoked,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
}
_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def from_status(code: grpc.StatusCode | int | None, detail: str, socket: str) -> BatonError:
    """The client error for a refused request (a gRPC status code, or its number)."""
    if isinstance(code, int):
        code = _BY_NUMBER.get(code)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return AgentUnavailable(f"lost the Baton agent at {socket}: {detail}")
    kind = _KINDS.get(code, BatonError) if code is not None else BatonError
    return kind(detail or str(code))


def from_rpc_error(exc: grpc.aio.AioRpcError, socket: str) -> BatonError:
    """The client error for a failed RPC."""
    return from_status(exc.code(), exc.details() or "", socket)
