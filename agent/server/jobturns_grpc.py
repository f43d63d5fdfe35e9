"""The coordinator's channel to this agent: `baton.coordinator.v1.JobTurns` over gRPC on TCP.

Each call must carry the coordination token (`authorization: Bearer <token>`, the token both
read from one Secret); anything else is refused UNAUTHENTICATED before it reaches a turn.
"""

from __future__ import annotations

import logging

import grpc

from agent.core import errors
from agent.server import api_ops
from agent.server.jobturns import JobTurns, NodeTurn, NoMembers, PrepareFailed, UnknownTurn
from baton._pb import jobturns_pb2 as jt
from baton._pb import jobturns_pb2_grpc as jt_grpc
from baton.contract.coordination import carries_token

log = logging.getLogger(__name__)


def _code(exc: errors.AgentError) -> grpc.StatusCode:
    if isinstance(exc, NoMembers | UnknownTurn):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, PrepareFailed):
        return grpc.StatusCode.ABORTED
    return api_ops.status_code(exc)


_mapped = api_ops.aborting(_code)


def node_turn_pb(turn: NodeTurn) -> jt.NodeTurn:
    """A node turn as the wire carries it."""
    return jt.NodeTurn(
        turn_id=turn.turn_id,
        namespace=turn.namespace,
        job=turn.job,
        epoch=turn.epoch,
        state=turn.state,
        members=turn.members,
        gpus=turn.gpus,
        fencing_tokens=turn.tokens,
        prepared_at=turn.prepared_at,
        committed_at=turn.committed_at,
        group=turn.group,
        restored=turn.restored,
        joined=turn.joined,
        nodes=turn.nodes,
    )


class JobTurnsServicer(jt_grpc.JobTurnsServicer):
    """Authenticates each call and forwards it to `JobTurns`."""

    def __init__(self, turns: JobTurns, token: str) -> None:
        if not token:
            raise ValueError("the coordination token is empty")
        self._turns = turns
        self._token = token

    def _check(self, context: grpc.aio.ServicerContext) -> None:
        if not carries_token(context.invocation_metadata(), self._token):
            raise errors.Unauthenticated(
                "job-turn calls need the coordination token (authorization: Bearer <token>)"
            )

    @_mapped
    async def Prepare(
        self, request: jt.PrepareRequest, context: grpc.aio.ServicerContext
    ) -> jt.NodeTurn:
        self._check(context)
        timeout = request.timeout_s or None
        turn = await self._turns.prepare(
            request.epoch,
            request.turn_id,
            request.namespace,
            request.job,
            timeout,
            request.pods,
            request.group,
            request.nodes,
        )
        return node_turn_pb(turn)

    @_mapped
    async def Commit(
        self, request: jt.CommitRequest, context: grpc.aio.ServicerContext
    ) -> jt.NodeTurn:
        self._check(context)
        return node_turn_pb(self._turns.commit(request.epoch, request.turn_id))

    @_mapped
    async def Release(
        self, request: jt.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> jt.ReleaseResponse:
        self._check(context)
        released = self._turns.release(request.epoch, request.turn_id, request.reason)
        return jt.ReleaseResponse(released=released)

    @_mapped
    async def Report(
        self, request: jt.ReportRequest, context: grpc.aio.ServicerContext
    ) -> jt.ReportResponse:
        self._check(context)
        turns = self._turns.report(request.epoch)
        return jt.ReportResponse(
            node=self._turns.node, epoch=self._turns.epoch, turns=[node_turn_pb(t) for t in turns]
        )


class JobTurnServer:
    """Serves `JobTurns` on its own TCP listener (the agent's gRPC socket stays a unix socket)."""

    def __init__(self, turns: JobTurns, listen: str, token: str) -> None:
        self.turns = turns
        self._listen = listen
        self._servicer = JobTurnsServicer(turns, token)
        self._server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        """Bind and serve; returns the port (for `:0`). RuntimeError naming the address if not."""
        self._server = grpc.aio.server()
        try:
            self.port = self._server.add_insecure_port(self._listen)
        except RuntimeError:
            self.port = 0
        if not self.port:
            raise RuntimeError(f"--coordination-listen {self._listen}: cannot listen there")
        jt_grpc.add_JobTurnsServicer_to_server(self._servicer, self._server)
        await self._server.start()
        log.info("job turns for the coordinator on %s (epoch %d)", self._listen, self.turns.epoch)
        return self.port

    async def stop(self, grace: float) -> None:
        """Stop serving; the job turns stay (on disk too) for the next agent."""
        if self._server is not None:
            await self._server.stop(grace)
