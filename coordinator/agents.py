"""The coordinator's calls to the node agents' job turns (`baton.coordinator.v1.JobTurns`).

One gRPC channel per agent address, each call bounded, each carrying the coordination token and
the leader's epoch. A failed call is a `NodeFailed` naming the node and the agent's reason.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import grpc

from baton._pb import jobturns_pb2 as jt
from baton._pb import jobturns_pb2_grpc as jt_grpc
from baton.contract.coordination import token_metadata

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 10.0
"""Commit, release and report must be answered within this; a prepare within its own bound."""


class NodeFailed(Exception):
    """A node's agent refused or did not answer; `node` names it, the message says why."""

    def __init__(self, node: str, why: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(f"node {node}: {why}")
        self.node = node
        self.why = why
        self.code = code


class AgentLinks:
    """Channels to the agents, by address; `close` them when done."""

    def __init__(self, token: str, call_timeout_s: float = CALL_TIMEOUT_S) -> None:
        if not token:
            raise ValueError("the coordination token is empty")
        self._metadata = token_metadata(token)
        self._timeout = call_timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _stub(self, address: str) -> jt_grpc.JobTurnsStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(address)
            self._channels[address] = channel
        return jt_grpc.JobTurnsStub(channel)

    async def prepare(
        self,
        node: str,
        address: str,
        epoch: int,
        turn: tuple[str, str, str, str],
        pods: Sequence[str],
        timeout_s: float,
        nodes: Sequence[str] = (),
    ) -> jt.NodeTurn:
        """Make room for the members `pods` on `node`; `turn` is (id, namespace, job, group),
        `nodes` every node of the turn."""
        turn_id, namespace, job, group = turn
        request = jt.PrepareRequest(
            epoch=epoch,
            turn_id=turn_id,
            namespace=namespace,
            job=job,
            group=group,
            pods=pods,
            timeout_s=timeout_s,
            nodes=nodes,
        )
        try:
            stub = self._stub(address)
            answer: jt.NodeTurn = await stub.Prepare(
                request, metadata=self._metadata, timeout=timeout_s + self._timeout
            )
        except grpc.aio.AioRpcError as err:
            raise _failed(node, err) from None
        return answer

    async def commit(self, node: str, address: str, epoch: int, turn_id: str) -> jt.NodeTurn:
        """Start the prepared turn on `node`."""
        try:
            answer: jt.NodeTurn = await self._stub(address).Commit(
                jt.CommitRequest(epoch=epoch, turn_id=turn_id),
                metadata=self._metadata,
                timeout=self._timeout,
            )
        except grpc.aio.AioRpcError as err:
            raise _failed(node, err) from None
        return answer

    async def release(self, node: str, address: str, epoch: int, turn_id: str, reason: str) -> bool:
        """End the turn on `node`; whether the agent still had it."""
        try:
            answer = await self._stub(address).Release(
                jt.ReleaseRequest(epoch=epoch, turn_id=turn_id, reason=reason),
                metadata=self._metadata,
                timeout=self._timeout,
            )
        except grpc.aio.AioRpcError as err:
            raise _failed(node, err) from None
        return bool(answer.released)

    async def report(self, node: str, address: str, epoch: int) -> jt.ReportResponse:
        """Every job turn `node` holds (its epoch raised to `epoch`)."""
        try:
            answer: jt.ReportResponse = await self._stub(address).Report(
                jt.ReportRequest(epoch=epoch), metadata=self._metadata, timeout=self._timeout
            )
        except grpc.aio.AioRpcError as err:
            raise _failed(node, err) from None
        return answer

    async def close(self) -> None:
        """Close every channel."""
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()


def _failed(node: str, err: grpc.aio.AioRpcError) -> NodeFailed:
    code = err.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        why = f"its agent is unreachable ({err.details()})"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        why = "its agent did not answer in time"
    else:
        why = str(err.details() or code.name)
    return NodeFailed(node, why, code)


def failure_text(failed: list[tuple[str, BaseException]]) -> str:
    """Why a job's turn failed: the first node's error (`NodeFailed` names its node)."""
    node, error = failed[0]
    text = str(error) if isinstance(error, NodeFailed) else f"node {node}: {error}"
    more = f" (and {len(failed) - 1} more node(s))" if len(failed) > 1 else ""
    return text + more
