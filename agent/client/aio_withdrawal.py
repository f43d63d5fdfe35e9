"""An `AsyncBaton.acquire` given up on while it waits (its task cancelled, an `asyncio.timeout`
run out, no answer in time) leaves the agent's queue.

The session sends a cancel and waits for the agent's answer to it: "cancelled", or the grant
that crossed the cancel, which is handed back. The client's next acquire waits for that answer,
as `Baton`'s does (`agent.client.call_link`): asked sooner, the agent would find the tenant
still queued and refuse the new request ("already waits").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from agent.client.errors import AgentUnavailable
from agent.client.types import REPLY_TIMEOUT_S
from baton._pb import agent_pb2 as pb

Send = Callable[[pb.ClientMessage], Awaitable[None]]


def withdrawal(
    replies: dict[int, asyncio.Future[pb.Reply]],
    request_id: int,
    answer: asyncio.Future[pb.Reply],
    sent: bool,
    send: Send,
    unclaimed: Callable[[pb.Reply], pb.Request | None],
) -> Coroutine[Any, Any, None]:
    """The withdrawal of acquire `request_id` whose `answer` was given up on: the grant, if it
    came (the answer, or the session's end, read off `replies`: one that came to an answer
    already cancelled was handed back as unclaimed); else the cancel's answer is awaited in
    `replies`. `sent`: False where it may not have left (cut off in its write): no answer is
    waited for then."""
    if replies.get(request_id) is answer and (not answer.done() or answer.cancelled()):
        replies[request_id] = answer = asyncio.get_running_loop().create_future()
    return _withdraw(replies, request_id, answer, sent, send, unclaimed)


async def _withdraw(
    replies: dict[int, asyncio.Future[pb.Reply]],
    request_id: int,
    answer: asyncio.Future[pb.Reply],
    sent: bool,
    send: Send,
    unclaimed: Callable[[pb.Reply], pb.Request | None],
) -> None:
    cancel = pb.Request(request_id=request_id, cancel=pb.CancelRequest())
    try:  # (the session ended: its queue places went with it, nothing is left to withdraw)
        with contextlib.suppress(AgentUnavailable, TimeoutError):
            if not answer.done():
                await send(pb.ClientMessage(request=cancel))
                if sent:
                    await asyncio.wait_for(answer, REPLY_TIMEOUT_S)
    finally:
        if replies.get(request_id) is answer:
            del replies[request_id]
    if not answer.done() or answer.cancelled() or answer.exception() is not None:
        return  # (no answer in time: one that comes later is handled as unclaimed)
    if (release := unclaimed(answer.result())) is not None:  # a grant: handed back
        with contextlib.suppress(AgentUnavailable):
            await send(pb.ClientMessage(request=release))
