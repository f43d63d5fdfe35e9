"""Baton's own job-turn API (`baton.coordinator.v1.Jobs`), for the node agents: a member pod's
acquire and yield, forwarded by its node's agent, which vouches for the pod with the
coordination token (`authorization: Bearer <token>`)."""

from __future__ import annotations

import grpc

from baton._pb import jobturns_pb2 as jt
from baton._pb import jobturns_pb2_grpc as jt_grpc
from baton.contract.coordination import carries_token
from baton.contract.deadline import answer_before
from coordinator.llmd import Refused, mapped
from coordinator.turns import Arbiter, TurnFailed


class JobsServicer(jt_grpc.JobsServicer):
    """Join and Leave, for agents only."""

    def __init__(self, arbiter: Arbiter, token: str) -> None:
        self._arbiter = arbiter
        self._token = token

    def _check(
        self, context: grpc.aio.ServicerContext, request: jt.JoinRequest | jt.LeaveRequest
    ) -> None:
        if not carries_token(context.invocation_metadata(), self._token):
            raise Refused(
                grpc.StatusCode.UNAUTHENTICATED,
                "Jobs calls come from node agents, with the coordination token",
            )
        if not request.pod.startswith(f"{request.namespace}/") or not request.job:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"pod {request.pod!r} is not in namespace {request.namespace!r}, or no job named",
            )

    @mapped
    async def Join(
        self, request: jt.JoinRequest, context: grpc.aio.ServicerContext
    ) -> jt.JoinResponse:
        self._check(context, request)
        self._arbiter.check_leading()
        # A pod the view does not count yet (its watch lags): a turn prepared for the job without
        # it would not take it in, and nobody would end it. Its agent asks again, with backoff.
        plan = self._arbiter.view.plan(request.namespace, request.job, request.group)
        if not any(request.pod in pods for pods in plan.pods.values()):
            raise Refused(
                grpc.StatusCode.UNAVAILABLE,
                f"job {plan.key}: this coordinator does not see pod {request.pod} among its "
                "members yet (its watch of pods has not shown the pod bound to its node)",
            )
        timeout = request.timeout_s or None
        remaining = answer_before(context.time_remaining())  # so the agent hears why it waited
        if remaining is not None:
            timeout = min(timeout or remaining, remaining)
        try:
            turn = await self._arbiter.join(
                request.namespace, request.job, request.group, request.pod, timeout
            )
        except TurnFailed as exc:  # a node failed the turn: not an election to wait out
            raise Refused(grpc.StatusCode.ABORTED, str(exc)) from None
        return jt.JoinResponse(
            turn_id=turn.turn_id,
            waited_ms=int(turn.waited * 1000),
            join_id=turn.joins.get(request.pod, ""),
        )

    @mapped
    async def Leave(
        self, request: jt.LeaveRequest, context: grpc.aio.ServicerContext
    ) -> jt.LeaveResponse:
        self._check(context, request)
        ended = await self._arbiter.leave(
            request.namespace,
            request.job,
            request.group,
            request.pod,
            turn_id=request.turn_id,
            join_id=request.join_id,
        )
        return jt.LeaveResponse(ended=ended)
