"""The coordinator's connection to this agent's job turns: frames of
`baton.coordinator.v1.JobTurnsCall` and `JobTurnsAnswer` on TCP (`--coordination-listen`).

The protocol is described at the top of `proto/baton/coordinator/v1/jobturns.proto`. The
connection must open with the coordination token (the Secret both read); anything else is
refused UNAUTHENTICATED and closed before it reaches a turn. A commit, release or report is
carried out as its frame is read; a prepare, which may wait for room, runs as a task of its own,
so a release arriving behind it is not held up, and is cancelled by `cancel` or by the
connection's end (as a gRPC call's cancellation would). A release that ends a preparation still
running is answered once that preparation has given back what it was granted: "released" means
the node holds nothing of the turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Coroutine
from typing import Any

from agent.core import errors
from agent.server import api_ops
from agent.server.jobturns import (
    JobTurns,
    NodeTurn,
    NoMembers,
    NotRecorded,
    PrepareFailed,
    UnknownTurn,
)
from baton._pb import jobturns_pb2 as jt
from baton.contract.framing import (
    HELLO_MAX_BYTES,
    Corked,
    FrameCut,
    FrameError,
    FrameTooLarge,
    encode,
    keep_alive,
    read_frame,
)
from baton.contract.tcpbind import served_at

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0
"""A connection that has not said hello by then is closed."""


def _code(exc: errors.AgentError) -> str:
    if isinstance(exc, NoMembers | UnknownTurn):
        return "NOT_FOUND"
    if isinstance(exc, PrepareFailed):
        return "ABORTED"
    if isinstance(exc, NotRecorded):
        return "UNAVAILABLE"
    return api_ops.status_code(exc).name


def node_turn_pb(turns: JobTurns, turn: NodeTurn) -> jt.NodeTurn:
    """A node turn as the wire carries it, with its members' live tokens (`live_tokens`)."""
    return jt.NodeTurn(
        turn_id=turn.turn_id,
        namespace=turn.namespace,
        job=turn.job,
        epoch=turn.epoch,
        state=turn.state,
        members=turn.members,
        gpus=turn.gpus,
        fencing_tokens=live_tokens(turns, turn),
        prepared_at=turn.prepared_at,
        committed_at=turn.committed_at,
        group=turn.group,
        restored=turn.restored,
        joined=turn.joined + [pod for pod in turn.leaving if pod not in turn.joined],
        nodes=turn.nodes,
    )


def live_tokens(turns: JobTurns, turn: NodeTurn) -> tuple[int, ...]:
    """Each member's fencing token (its lowest GPU's) as it computes now: its live lease's,
    which a revocation given back renews; the one it was prepared with while it has none."""
    leases = (turns.lease(lease_id) for lease_id in turn.leases)
    return tuple(
        min(lease.tokens.values()) if lease is not None else token
        for lease, token in zip(leases, turn.tokens, strict=True)
    )


def refusal(call_id: int, code: str, details: str) -> jt.JobTurnsAnswer:
    """A call's failure as the wire carries it."""
    return jt.JobTurnsAnswer(id=call_id, refused=jt.Refusal(code=code, details=details))


class _Connection:
    """One coordinator's connection: its calls in flight, by id."""

    def __init__(self, turns: JobTurns, writer: asyncio.StreamWriter) -> None:
        self._turns = turns
        self.holder = ""
        """The coordinator's identity, as its hello named it ("" from an older one)."""
        self._out = Corked(writer)
        self.running: dict[int, asyncio.Task[None]] = {}

    def handle(self, call: jt.JobTurnsCall) -> None:
        """Carry out one call (a prepare on a task of its own); its answer is written."""
        kind = call.WhichOneof("call")
        if kind == "cancel":
            task = self.running.pop(call.id, None)
            if task is not None:
                task.cancel()
            return
        if kind == "prepare":
            if call.id in self.running:
                self._send(refusal(call.id, "INVALID_ARGUMENT", f"call id {call.id} is in use"))
                return
            self._run(call.id, self._prepare(call.id, call.prepare))
            return
        ending = self._turns.preparation(call.release.turn_id) if kind == "release" else None
        try:
            answer = self._at_once(call, kind)
        except errors.AgentError as exc:
            answer = refusal(call.id, _code(exc), str(exc))
        except Exception as exc:  # a defect: the call fails, the connection and agent go on
            log.exception("job-turn %s call failed", kind)
            answer = refusal(call.id, "INTERNAL", f"{type(exc).__name__}: {exc}")
        if ending is not None and not ending.done() and answer.HasField("released"):
            # A release that cancelled a preparation is answered once it has ended: its members
            # granted already have given their turns back and the others left the queue, so the
            # coordinator (and the job it tells of the roll-back) finds nothing of it held here.
            self._run(call.id, self._answer_after(ending, answer))
            return
        self._send(answer)

    def _run(self, call_id: int, work: Coroutine[Any, Any, None]) -> None:
        """Carry out a call on a task of its own, which its `cancel` or the connection's end
        gives up."""
        task = asyncio.get_running_loop().create_task(work)
        self.running[call_id] = task
        task.add_done_callback(lambda _: self.running.pop(call_id, None))

    async def _answer_after(
        self, ending: asyncio.Task[NodeTurn], answer: jt.JobTurnsAnswer
    ) -> None:
        await asyncio.wait({ending})  # prompt: a cancelled acquire leaves at once
        self._send(answer)

    def _at_once(self, call: jt.JobTurnsCall, kind: str | None) -> jt.JobTurnsAnswer:
        turns = self._turns
        if kind == "commit":
            turn = turns.commit(call.commit.epoch, call.commit.turn_id, self.holder)
            return jt.JobTurnsAnswer(id=call.id, turn=node_turn_pb(turns, turn))
        if kind == "release":
            request = call.release
            released = turns.release(request.epoch, request.turn_id, request.reason, self.holder)
            return jt.JobTurnsAnswer(id=call.id, released=jt.ReleaseResponse(released=released))
        if kind == "report":
            held = turns.report(call.report.epoch, self.holder)
            report = jt.ReportResponse(
                node=turns.node,
                epoch=turns.epoch,
                turns=[node_turn_pb(turns, t) for t in held],
                holder=turns.holder,
                now=turns.now(),
            )
            return jt.JobTurnsAnswer(id=call.id, report=report)
        return refusal(call.id, "INVALID_ARGUMENT", f"a call of kind {kind or 'none'} is unknown")

    async def _prepare(self, call_id: int, request: jt.PrepareRequest) -> None:
        answered = False

        def prepared(turn: NodeTurn) -> None:  # in the step of the last member's grant
            nonlocal answered
            answered = True
            answer = jt.JobTurnsAnswer(id=call_id, turn=node_turn_pb(self._turns, turn))
            self._out.write_now(encode(answer))

        try:
            turn = await self._turns.prepare(
                request.epoch,
                request.turn_id,
                request.namespace,
                request.job,
                request.timeout_s or None,
                request.pods,
                request.group,
                request.nodes,
                on_prepared=prepared,
                holder=self.holder,
            )
        except errors.AgentError as exc:
            self._send(refusal(call_id, _code(exc), str(exc)))
            return
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # its own cancel, or the connection's end: no answer
            if answered:  # prepared, then released: the release's answer tells the rest
                return
            node, turn_id = self._turns.node, request.turn_id
            why = f"node {node}: turn {turn_id} was released while being prepared"
            self._send(refusal(call_id, "ABORTED", why))  # a release ended the preparation
            return
        except Exception as exc:  # a defect: the call fails, the connection and agent go on
            log.exception("job-turn prepare failed")
            self._send(refusal(call_id, "INTERNAL", f"{type(exc).__name__}: {exc}"))
            return
        if not answered:  # a turn prepared already, or one a member's owed turn completed
            self._send(jt.JobTurnsAnswer(id=call_id, turn=node_turn_pb(self._turns, turn)))

    def _send(self, answer: jt.JobTurnsAnswer) -> None:
        self._out.write(encode(answer))

    async def close(self) -> None:
        """Give up every call still running (the coordinator is gone)."""
        for task in list(self.running.values()):
            task.cancel()
        await asyncio.gather(*self.running.values(), return_exceptions=True)


class JobTurnServer:
    """Serves the job turns on their own TCP listener (the agent's gRPC socket stays a unix
    socket); `start`, then `stop`."""

    def __init__(self, turns: JobTurns, listen: str, token: str) -> None:
        if not token:
            raise ValueError("the coordination token is empty")
        self.turns = turns
        self._listen = listen
        self._token = token.encode()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._open: set[_Connection] = set()
        self.port = 0

    async def start(self) -> int:
        """Bind and serve; returns the port (for `:0`). RuntimeError naming the address if not."""
        host, _, port = self._listen.rpartition(":")
        try:
            self._server = await asyncio.start_server(
                self._serve, host.strip("[]") or None, int(port)
            )
        except (OSError, ValueError) as exc:
            raise RuntimeError(
                f"--coordination-listen {self._listen}: cannot listen there ({exc})"
            ) from None
        self.port = self._server.sockets[0].getsockname()[1]
        log.info(
            "job turns for the coordinator on %s (epoch %d)",
            served_at(self._listen, self.port), self.turns.epoch,
        )  # fmt: skip
        return self.port

    async def stop(self, grace: float) -> None:
        """Stop serving: the calls running get `grace` seconds to finish, then every connection
        is closed (a preparation still making room is given up). The job turns stay (on disk
        too) for the next agent."""
        if self._server is None:
            return
        self._server.close()
        running = [t for c in self._open for t in c.running.values()]
        if running:
            await asyncio.wait(running, timeout=grace)
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        connection = _Connection(self.turns, writer)
        self._open.add(connection)
        try:
            keep_alive(writer)
            if await self._hello(reader, writer, peer, connection):
                while (call := await read_frame(reader, jt.JobTurnsCall)) is not None:
                    connection.handle(call)
        except FrameCut as exc:  # it went away as it wrote: no sign of another version
            log.warning("coordinator connection from %s: %s; closed", peer, exc)
        except FrameError as exc:
            hint = " (a coordinator of another Baton version? upgrade it and the agents together)"
            log.warning("coordinator connection from %s: %s; closed%s", peer, exc, hint)
        except OSError as exc:  # reset, or ended by keepalive
            log.warning("coordinator connection from %s: %s; closed", peer, exc)
        except asyncio.CancelledError:  # the agent stops: nothing to say, nothing to raise
            pass
        finally:
            self._connections.discard(task)
            self._open.discard(connection)
            await connection.close()
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _hello(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: object,
        connection: _Connection,
    ) -> bool:
        """Whether the connection opened with the token (the `connection` learns the
        coordinator's identity); if not, it is told why."""
        why = "job-turn calls need the coordination token (the first frame's hello)"
        try:
            first = await asyncio.wait_for(
                read_frame(reader, jt.JobTurnsCall, HELLO_MAX_BYTES), HELLO_TIMEOUT_S
            )
        except FrameTooLarge as exc:  # refused unread: no hello is that large
            first, why = jt.JobTurnsCall(), f"{why}; {exc}"
        except TimeoutError:  # asyncio's says nothing: the log line would give no reason
            log.warning(
                "coordinator connection from %s: no hello within %g s; closed",
                peer,
                HELLO_TIMEOUT_S,
            )
            return False
        if first is None:
            return False
        given = first.hello.token.encode() if first.WhichOneof("call") == "hello" else b""
        if not hmac.compare_digest(given, self._token):
            log.warning(
                "coordinator connection from %s without the coordination token: %s", peer, why
            )
            writer.write(encode(refusal(0, "UNAUTHENTICATED", why)))
            await writer.drain()
            return False
        connection.holder = first.hello.holder
        hello = jt.HelloAnswer(node=self.turns.node, epoch=self.turns.epoch)
        writer.write(encode(jt.JobTurnsAnswer(id=0, hello=hello)))
        return True
