"""The llm-d adapter's errors, and the one place they (and the agent's) become gRPC codes."""

from __future__ import annotations

import grpc

from agent.core import errors
from agent.server import api_ops


class UnknownGroup(errors.AgentError):
    """No group by that name on this node (NOT_FOUND)."""


class UnknownJob(errors.AgentError):
    """No job by that id on this node (NOT_FOUND)."""


class UnknownOperation(errors.AgentError):
    """No operation by that id (NOT_FOUND)."""


class UnsupportedBackend(errors.AgentError):
    """A snapshot backend this agent does not run (NOT_FOUND)."""


class NotImplementedHere(errors.AgentError):
    """A BackendConfig Baton has no method for (UNIMPLEMENTED); the message names what it has."""


class MethodMissing(errors.AgentError):
    """A method this node does not offer, or cannot use for the job (FAILED_PRECONDITION)."""


class Transitioning(errors.AgentError):
    """The job's memory is already moving (ABORTED)."""


class BadRequest(errors.AgentError):
    """A malformed request (INVALID_ARGUMENT)."""


_CODES: list[tuple[type[errors.AgentError], grpc.StatusCode]] = [
    (UnknownGroup, grpc.StatusCode.NOT_FOUND),
    (UnknownJob, grpc.StatusCode.NOT_FOUND),
    (UnknownOperation, grpc.StatusCode.NOT_FOUND),
    (UnsupportedBackend, grpc.StatusCode.NOT_FOUND),
    (NotImplementedHere, grpc.StatusCode.UNIMPLEMENTED),
    (MethodMissing, grpc.StatusCode.FAILED_PRECONDITION),
    (Transitioning, grpc.StatusCode.ABORTED),
    (BadRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.WaitRefused, grpc.StatusCode.RESOURCE_EXHAUSTED),
]


def status_code(exc: errors.AgentError) -> grpc.StatusCode:
    """The gRPC code llm-d's clients expect for a domain error."""
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    return api_ops.status_code(exc)


mapped = api_ops.aborting(status_code)
"""Answer a domain error with the gRPC code llm-d's clients expect, and its message."""
