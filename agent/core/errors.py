"""Domain errors of the lease service; `agent.server.grpc_server` maps each to one gRPC status."""

from __future__ import annotations


class AgentError(Exception):
    """A request the agent refuses; the message says what to do about it."""


class UnknownLease(AgentError):
    """No lease with that id (NOT_FOUND)."""


class NotOwner(AgentError):
    """The lease belongs to another tenant (PERMISSION_DENIED)."""

    def __init__(self, lease_id: str, owner: str) -> None:
        super().__init__(f"lease {lease_id} belongs to tenant {owner!r}, not to the caller")
        self.owner = owner


class TurnRevoked(AgentError):
    """The lease was revoked and its turn is being given back to its tenant: a renewal from a
    client that never heard of the revocation (ABORTED)."""


class AlreadyHolding(AgentError):
    """The tenant already holds or waits for one of these GPUs (FAILED_PRECONDITION)."""


class NoLease(AgentError):
    """Yield or renew without a lease (FAILED_PRECONDITION)."""


class InvalidGpus(AgentError):
    """Acquire on GPUs the tenant was not given (INVALID_ARGUMENT)."""


class InvalidRegistration(AgentError):
    """A registration with a field out of range (INVALID_ARGUMENT)."""


class AcquireTimeout(AgentError):
    """The turn was not granted in time; the waiter has left the queue (DEADLINE_EXCEEDED)."""


class WaitRefused(AcquireTimeout):
    """Timed out while a refusal (the host budget, a quarantine, a failed park) kept the turn
    from being prepared; the message has the numbers (llm-d's API: RESOURCE_EXHAUSTED)."""


class NotRegistered(AgentError):
    """The caller's process belongs to no known tenant (FAILED_PRECONDITION)."""


class RegistrationConflict(AgentError):
    """A registration that contradicts an existing tenant (FAILED_PRECONDITION)."""


class Forbidden(AgentError):
    """The caller may not act on that tenant (PERMISSION_DENIED)."""


class Unauthenticated(AgentError):
    """No valid session token (UNAUTHENTICATED)."""


class Cancelled(AgentError):
    """The client withdrew its pending acquire (CANCELLED)."""


class TenantGone(AgentError):
    """The tenant left while the call was in flight (UNAVAILABLE)."""


class NeverGranted(AgentError):
    """The turn can never be granted on this node (e.g. the tenant needs more memory than its
    GPU holds); refused when asked, not at the timeout (FAILED_PRECONDITION)."""


class Quarantined(AgentError):
    """The tenant's memory cannot be moved safely any more; it takes no more turns."""


class CallbackFailed(AgentError):
    """A tenant's park/restore callback failed or is not registered."""


class NoCoordinator(AgentError):
    """A job's turn was asked of an agent that has no coordinator (FAILED_PRECONDITION)."""
