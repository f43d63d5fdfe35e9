"""The agent API's operations, shared by the unary RPCs and the session stream."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from agent.core import errors
from agent.core.leases import Lease
from agent.node.tenants import Tenant
from agent.server.service import LeaseService, lease_to_pb
from baton._pb import agent_pb2 as pb

_CODES: list[tuple[type[errors.AgentError], grpc.StatusCode]] = [
    (errors.UnknownLease, grpc.StatusCode.NOT_FOUND),
    (errors.NotOwner, grpc.StatusCode.PERMISSION_DENIED),
    (errors.Forbidden, grpc.StatusCode.PERMISSION_DENIED),
    (errors.InvalidGpus, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.InvalidRegistration, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.AcquireTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (errors.TenantGone, grpc.StatusCode.UNAVAILABLE),
    (errors.Cancelled, grpc.StatusCode.CANCELLED),
    (errors.TurnRevoked, grpc.StatusCode.ABORTED),
]


def status_code(exc: errors.AgentError) -> grpc.StatusCode:
    """The one gRPC status code for a domain error (FAILED_PRECONDITION if none more precise)."""
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.FAILED_PRECONDITION


Req = TypeVar("Req")
Resp = TypeVar("Resp")
Handler = Callable[[Any, Req, grpc.aio.ServicerContext], Awaitable[Resp]]


def aborting(
    code_of: Callable[[errors.AgentError], grpc.StatusCode],
) -> Callable[[Handler[Req, Resp]], Handler[Req, Resp]]:
    """A decorator for RPC handlers: a domain error aborts the call with `code_of` its code."""

    def decorate(handler: Handler[Req, Resp]) -> Handler[Req, Resp]:
        @functools.wraps(handler)
        async def wrapper(self: Any, request: Req, context: grpc.aio.ServicerContext) -> Resp:
            try:
                return await handler(self, request, context)
            except errors.AgentError as exc:
                await context.abort(code_of(exc), str(exc))
                raise  # abort() raises; this line only satisfies the type checker

        return wrapper

    return decorate


def error_status(exc: errors.AgentError) -> pb.ErrorStatus:
    """A domain error as sent on the session stream."""
    return pb.ErrorStatus(code=status_code(exc).value[0], message=str(exc))


async def acquire(
    service: LeaseService,
    tenant: Tenant,
    request: pb.AcquireRequest,
    on_grant: Callable[[pb.Lease], None] | None = None,
) -> pb.Lease:
    """Wait for the turn; `on_grant` hears of it as it is made (before this returns)."""
    timeout = request.timeout_ms / 1000 if request.timeout_ms > 0 else None
    job = service.jobs.job_of(tenant, request.job) if service.jobs else ""
    if request.job and service.jobs is None:
        raise errors.NoCoordinator(
            f"job {request.job!r}: this node's agent has no coordinator (--coordinator), so it "
            "takes no job's turn"
        )
    if job and service.jobs is not None:
        joined = lease_to_pb(await service.jobs.join(tenant, job, timeout))
        if on_grant is not None:
            on_grant(joined)
        return joined

    def tell(lease: Lease) -> None:
        if on_grant is not None:
            on_grant(lease_to_pb(lease, service.table.contended(lease)))

    granted = await service.acquire(
        tenant,
        tuple(request.gpus),
        timeout,
        tell if on_grant else None,
        handed=request.restores_with_grant,
        revoked=request.revoked_lease_id,
    )
    return lease_to_pb(granted.lease, service.table.contended(granted.lease))


def release(
    service: LeaseService,
    tenant: Tenant,
    request: pb.YieldRequest,
    on_ended: Callable[[pb.YieldResponse], None] | None = None,
) -> pb.YieldResponse:
    """End the turn (for a member of a job's turn: leave it); `on_ended` may hear the answer
    before this returns (`Turns.yield_`)."""
    if service.jobs is not None and service.jobs.holds(tenant, request.lease_id):
        return pb.YieldResponse(held_seconds=service.jobs.leave(tenant, request.lease_id))

    def answer(held: float) -> None:
        if on_ended is not None:
            on_ended(pb.YieldResponse(held_seconds=held))

    if request.still_parked:  # before the yield: the next grant plans with it
        service.not_restored(tenant, request.still_parked)
    if request.parked:  # what it parked itself as it yields: before the next grant plans
        service.parked_at_yield(tenant, request.lease_id, request.parked)

    held = service.yield_(tenant, request.lease_id, answer if on_ended else None, request.kept_s)
    return pb.YieldResponse(held_seconds=held)


def renew(service: LeaseService, tenant: Tenant, lease_id: str) -> pb.Lease:
    """Check (and report on) one of the tenant's own leases."""
    if not lease_id:
        raise errors.NoLease("renew needs the id of a lease the tenant holds")
    lease = service.inspect(tenant, lease_id)
    return lease_to_pb(lease, service.table.contended(lease))


def tenant_to_pb(tenant: Tenant) -> pb.Tenant:
    """The wire form of a tenant."""
    return pb.Tenant(
        tenant_id=tenant.tenant_id,
        name=tenant.name,
        gpus=tenant.gpus,
        gpu_memory_mib=tenant.gpu_memory_mib,
        gpu_duty=tenant.gpu_duty,
        memory_limit_bytes=tenant.memory_limit_bytes,
        source=tenant.source,
    )
