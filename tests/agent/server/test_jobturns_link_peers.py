"""What an agent's job-turn port does with a peer that is no coordinator, or a broken one: no
token, a first frame too large for a hello, no hello in time, bytes that are no call, gRPC, a
frame cut off (`agent.server.jobturns_link`). Each is refused or closed in one line, holds
nothing, and the agent goes on serving a coordinator with the token."""

from __future__ import annotations

import asyncio
import logging
import struct
from pathlib import Path

import grpc
import pytest

from agent.server import jobturns_link
from baton._pb import jobturns_pb2 as jt
from baton.contract import framing
from baton.contract.framing import encode, read_frame
from coordinator.agents import AgentLinks, NodeFailed
from tests.agent.server.test_jobturns import TOKEN, run
from tests.agent.server.test_jobturns_link import serving


async def raw(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the job-turn port at `address`, written and read by the test."""
    host, _, port = address.rpartition(":")
    return await asyncio.open_connection(host, int(port))


async def still_served(address: str) -> None:
    """The agent serves a coordinator with the token, on a connection of its own."""
    links = AgentLinks(TOKEN)
    assert (await links.report("n1", address, 1)).node == "n1"
    await links.close()


def test_a_caller_without_the_token_is_refused_unauthenticated(tmp_path: Path) -> None:
    async def body() -> None:
        async with serving(tmp_path) as (service, _, address):
            links = AgentLinks("not-the-token")
            with pytest.raises(NodeFailed) as refused:
                await links.report("n1", address, 1)
            assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
            assert "coordination token" in refused.value.why
            await links.close()
            # A connection whose first frame is a call, not the hello, is refused the same way.
            reader, writer = await raw(address)
            writer.write(encode(jt.JobTurnsCall(id=1, report=jt.ReportRequest(epoch=1))))
            answer = await read_frame(reader, jt.JobTurnsAnswer)
            assert answer is not None and answer.refused.code == "UNAUTHENTICATED"
            assert await read_frame(reader, jt.JobTurnsAnswer) is None  # and closed
            writer.close()
            assert not service.table.leases

    run(body)


def test_a_first_frame_too_large_for_a_hello_is_refused_before_its_body_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer without the token may not make the agent wait for (and hold) a call's worth of
    bytes: a first frame announced larger than any hello is refused at its header."""
    monkeypatch.setattr(jobturns_link, "HELLO_TIMEOUT_S", 60.0)  # past `run`'s deadline

    async def body() -> None:
        async with serving(tmp_path) as (service, _, address):
            reader, writer = await raw(address)
            writer.write(struct.pack("!I", framing.MAX_FRAME_BYTES))  # a header, no body (yet)
            answer = await read_frame(reader, jt.JobTurnsAnswer)
            assert answer is not None and answer.refused.code == "UNAUTHENTICATED"
            assert f"a frame of {framing.MAX_FRAME_BYTES} bytes is over the limit of" in (
                answer.refused.details
            )
            assert await read_frame(reader, jt.JobTurnsAnswer) is None  # and closed
            writer.close()
            await still_served(address)
            assert not service.table.leases

    run(body)


def test_a_connection_that_never_says_hello_is_closed_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(jobturns_link, "HELLO_TIMEOUT_S", 0.2)

    async def body() -> None:
        async with serving(tmp_path) as (_, _, address):
            reader, writer = await raw(address)
            writer.write(struct.pack("!I", 100) + b"\x0a")  # a hello begun, never finished
            assert await read_frame(reader, jt.JobTurnsAnswer) is None  # closed by the agent
            writer.close()
            await still_served(address)

    with caplog.at_level(logging.WARNING, logger="agent.server.jobturns_link"):
        run(body)
    [said] = [r.getMessage() for r in caplog.records if r.name == "agent.server.jobturns_link"]
    assert said.endswith(": no hello within 0.2 s; closed"), said


def test_a_frame_that_is_not_a_call_ends_the_connection_and_nothing_else(tmp_path: Path) -> None:
    async def body() -> None:
        async with serving(tmp_path) as (_, _, address):
            reader, writer = await raw(address)
            writer.write(encode(jt.JobTurnsCall(id=0, hello=jt.Hello(token=TOKEN))))
            hello = await read_frame(reader, jt.JobTurnsAnswer)
            assert hello is not None and hello.hello.node == "n1"
            writer.write(b"\x00\x00\x00\x03\xff\xff\xff")  # no JobTurnsCall parses from this
            assert await read_frame(reader, jt.JobTurnsAnswer) is None
            writer.close()
            await still_served(address)

    run(body)


def test_a_grpc_client_is_told_it_speaks_the_wrong_protocol(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        async with serving(tmp_path) as (_, _, address):
            reader, writer = await raw(address)
            writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # an older coordinator's gRPC
            assert await read_frame(reader, jt.JobTurnsAnswer) is None  # closed
            writer.close()

    with caplog.at_level(logging.WARNING):
        run(body)
    assert "speaks gRPC" in caplog.text and "upgrade it and the agents together" in caplog.text


def test_a_coordinator_gone_inside_a_frame_is_not_taken_for_another_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A coordinator stopped as it wrote a call: no hint of another Baton version."""

    async def body() -> None:
        async with serving(tmp_path) as (_, _, address):
            reader, writer = await raw(address)
            writer.write(encode(jt.JobTurnsCall(id=0, hello=jt.Hello(token=TOKEN))))
            assert await read_frame(reader, jt.JobTurnsAnswer) is not None
            writer.write(struct.pack("!I", 100) + b"\x08")  # 1 byte of a 100-byte call
            writer.write_eof()
            assert await read_frame(reader, jt.JobTurnsAnswer) is None  # the agent closed it
            writer.close()

    with caplog.at_level(logging.WARNING, logger="agent.server.jobturns_link"):
        run(body)
    [said] = [r.getMessage() for r in caplog.records if r.name == "agent.server.jobturns_link"]
    assert said.endswith(": the connection ended inside a frame of 100 bytes; closed"), said
