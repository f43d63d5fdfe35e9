"""The coordinator's calls to the node agents' job turns (`baton.coordinator.v1`).

One TCP connection per agent address, opened with the coordination token and carrying frames
(the protocol is at the top of `proto/baton/coordinator/v1/jobturns.proto`); calls on it are
answered by id, in any order. Each call is bounded and carries the leader's epoch. A failed call
is a `NodeFailed` naming the node and the agent's reason, with the gRPC status code the agent
gave (UNAVAILABLE when it cannot be reached or the connection ends, DEADLINE_EXCEEDED when it
does not answer in time). A call given up (its deadline, or its caller cancelled) is cancelled
on the agent too.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
from collections.abc import Collection, Sequence
from typing import Any

import grpc

from baton._pb import jobturns_pb2 as jt
from baton.contract.framing import Corked, FrameError, encode, keep_alive, read_frame

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 10.0
"""Commit, release and report must be answered within this; a prepare within its own bound."""
CONNECT_TIMEOUT_S = 5.0
"""How long opening a connection (and its hello) may take."""


class NodeFailed(Exception):
    """A node's agent refused or did not answer; `node` names it, the message says why (led by
    the node's name unless the agent's own words name it already)."""

    def __init__(self, node: str, why: str, code: grpc.StatusCode | None = None) -> None:
        named = re.search(rf"\bnode {re.escape(node)}\b", why) is not None
        super().__init__(why if named else f"node {node}: {why}")
        self.node = node
        self.why = why
        self.code = code


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code


class _Lost(Exception):
    """The connection ended (or could not be opened); the message says how."""


def _status(name: str) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, name, grpc.StatusCode.UNKNOWN)


class _Link:
    """One open connection to an agent: calls written with an id, answers matched to them."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._out = Corked(writer)
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[jt.JobTurnsAnswer]] = {}
        self.lost: str = ""
        self._reading = asyncio.get_running_loop().create_task(self._read(reader))

    @classmethod
    async def open(cls, node: str, address: str, token: str, holder: str = "") -> _Link:
        """Connect and say hello (naming the leader's identity `holder`), within
        `CONNECT_TIMEOUT_S`; `_Lost` or `_Refused` if not."""
        host, _, port = address.rpartition(":")
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
                keep_alive(writer)
                writer.write(
                    encode(jt.JobTurnsCall(id=0, hello=jt.Hello(token=token, holder=holder)))
                )
                answer = await read_frame(reader, jt.JobTurnsAnswer)
        except TimeoutError:
            _close(writer)
            opened = "no hello" if writer is not None else "no connection"
            raise _Lost(f"{opened} from {address} within {CONNECT_TIMEOUT_S:g} s") from None
        except FrameError as exc:
            _close(writer)
            raise _Lost(f"{address}: {exc}{_OTHER_VERSION}") from None
        except (OSError, ValueError) as exc:
            _close(writer)
            raise _Lost(f"{address}: {exc}") from None
        except BaseException:
            _close(writer)
            raise
        kind = answer.WhichOneof("answer") if answer is not None else None
        if kind != "hello" or answer is None or answer.hello.node != node:
            writer.close()
            if answer is not None and kind == "refused":
                raise _Refused(_status(answer.refused.code), answer.refused.details)
            if answer is not None and kind == "hello":
                raise _Lost(f"{address} is the agent of node {answer.hello.node}, not of {node}")
            raise _Lost(f"{address} closed the connection before its hello{_OTHER_VERSION}")
        return cls(reader, writer)

    async def call(self, timeout: float, **call: Any) -> jt.JobTurnsAnswer:
        """Send one call (`prepare=...` etc.) and wait for its answer; `_Lost`, `_Refused`,
        `TimeoutError`; a call given up is cancelled on the agent."""
        if self.lost:
            raise _Lost(self.lost)
        call_id = next(self._ids)
        answer = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = answer
        self._out.write(encode(jt.JobTurnsCall(id=call_id, **call)))
        try:
            got = await asyncio.wait_for(answer, timeout)
        except BaseException:  # its deadline, or its caller cancelled it
            if self._waiting.pop(call_id, None) is not None and not self.lost:
                self._out.write(encode(jt.JobTurnsCall(id=call_id, cancel=jt.Cancel())))
            raise
        if got.WhichOneof("answer") == "refused":
            raise _Refused(_status(got.refused.code), got.refused.details)
        return got

    async def _read(self, reader: asyncio.StreamReader) -> None:
        why = "the agent closed the connection"
        try:
            while (answer := await read_frame(reader, jt.JobTurnsAnswer)) is not None:
                waiter = self._waiting.pop(answer.id, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(answer)
        except (OSError, FrameError) as exc:
            why = f"the connection failed: {exc}"
        except asyncio.CancelledError:
            why = "the coordinator closed the connection"
        finally:
            self._end(why)

    def _end(self, why: str) -> None:
        self.lost = self.lost or why
        waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            if not waiter.done():
                waiter.set_exception(_Lost(self.lost))
        self._writer.close()

    def busy(self) -> bool:
        """Whether calls on it wait for their answers."""
        return bool(self._waiting)

    def stop(self) -> None:
        """Close the connection (its reading task ends on the loop's next steps)."""
        self._reading.cancel()

    async def close(self) -> None:
        self._reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reading


class AgentLinks:
    """Connections to the agents, by address (opened on first use, again after one ends);
    `close` them when done."""

    def __init__(
        self, token: str, call_timeout_s: float = CALL_TIMEOUT_S, holder: str = ""
    ) -> None:
        """`holder`: this replica's identity (the Lease's holder), which the agents obey in
        one epoch only."""
        if not token:
            raise ValueError("the coordination token is empty")
        self._token = token
        self.holder = holder
        self._timeout = call_timeout_s
        self._links: dict[str, asyncio.Task[_Link]] = {}

    async def _link(self, node: str, address: str) -> _Link:
        opening = self._links.get(address)
        if opening is not None and opening.done():
            if not _unusable(opening):
                return opening.result()  # the usual case: open already
            opening = None  # failed or ended: open again
        if opening is None:
            opening = asyncio.get_running_loop().create_task(
                _Link.open(node, address, self._token, self.holder)
            )
            self._links[address] = opening
        return await asyncio.shield(opening)  # bounded by the opening itself

    async def _call(self, node: str, address: str, timeout: float, **call: Any) -> Any:
        """The answer's payload; `NodeFailed` naming `node` if the call fails."""
        try:
            link = await self._link(node, address)
            answer = await link.call(timeout, **call)
        except _Lost as exc:
            raise NodeFailed(node, f"its agent is unreachable ({exc})", _UNAVAILABLE) from None
        except TimeoutError:
            raise NodeFailed(node, "its agent did not answer in time", _DEADLINE) from None
        except _Refused as exc:
            raise NodeFailed(node, str(exc) or exc.code.name, exc.code) from None
        return getattr(answer, answer.WhichOneof("answer"))

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
        answer: jt.NodeTurn = await self._call(
            node, address, timeout_s + self._timeout, prepare=request
        )
        return answer

    async def commit(self, node: str, address: str, epoch: int, turn_id: str) -> jt.NodeTurn:
        """Start the prepared turn on `node`."""
        request = jt.CommitRequest(epoch=epoch, turn_id=turn_id)
        answer: jt.NodeTurn = await self._call(node, address, self._timeout, commit=request)
        return answer

    async def release(self, node: str, address: str, epoch: int, turn_id: str, reason: str) -> bool:
        """End the turn on `node`; whether the agent still had it."""
        request = jt.ReleaseRequest(epoch=epoch, turn_id=turn_id, reason=reason)
        answer = await self._call(node, address, self._timeout, release=request)
        return bool(answer.released)

    async def report(self, node: str, address: str, epoch: int) -> jt.ReportResponse:
        """Every job turn `node` holds (its epoch raised to `epoch`)."""
        request = jt.ReportRequest(epoch=epoch)
        answer: jt.ReportResponse = await self._call(node, address, self._timeout, report=request)
        return answer

    def forget_others(self, addresses: Collection[str]) -> None:
        """Close and forget the connections to agents at any other address (their nodes were
        deleted: an autoscaler's, spot nodes); one still opening or with calls in flight is
        left to a later call."""
        for address in [a for a in self._links if a not in addresses]:
            opening = self._links[address]
            if not opening.done():
                continue
            link = None if _failed(opening) else opening.result()
            if link is not None and link.busy():
                continue
            del self._links[address]
            if link is not None:
                link.stop()

    async def close(self) -> None:
        """Close every connection."""
        links, self._links = self._links, {}
        for opening in links.values():
            opening.cancel()  # one still opening; nothing for one opened
        for link in await asyncio.gather(*links.values(), return_exceptions=True):
            if isinstance(link, _Link):
                await link.close()


_OTHER_VERSION = (
    " (an agent of another Baton version speaks gRPC there: upgrade the coordinator and the"
    " agents together)"
)


def _close(writer: asyncio.StreamWriter | None) -> None:
    if writer is not None:
        writer.close()


def _failed(opening: asyncio.Task[_Link]) -> bool:
    """Whether a finished opening failed."""
    return opening.cancelled() or opening.exception() is not None


def _unusable(opening: asyncio.Task[_Link]) -> bool:
    """Whether a finished opening failed, or its connection has ended since."""
    return _failed(opening) or bool(opening.result().lost)


_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
_DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED


def failure_text(failed: list[tuple[str, BaseException]]) -> str:
    """Why a job's turn failed: the first node's error (`NodeFailed` names its node)."""
    node, error = failed[0]
    text = str(error) if isinstance(error, NodeFailed) else f"node {node}: {error}"
    more = f" (and {len(failed) - 1} more node(s))" if len(failed) > 1 else ""
    return text + more
