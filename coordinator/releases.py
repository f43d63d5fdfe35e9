"""Ending a job's turn on its nodes until every one has heard it.

A Release that fails (an agent restarting, a call cut off) would leave the job's pods holding
that node's GPUs with nobody computing, and the next job's prepare there waiting behind them. So
each release is a task the coordinator owns, not the caller's: it is sent again, with backoff,
until the agent answers (Release is idempotent: a turn already gone is released), or until this
replica stops leading (a newer leader settles the node's turns itself) or the agent says a
newer epoch leads. The caller waits for the first attempts only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

import grpc

from coordinator.agents import AgentLinks, NodeFailed

log = logging.getLogger(__name__)

FIRST_BACKOFF_S = 0.2
MAX_BACKOFF_S = 5.0


class Releases:
    """Releases in flight, each retried until its node answers."""

    def __init__(
        self, links: AgentLinks, epoch: Callable[[], int], known: Callable[[str], bool]
    ) -> None:
        """`known(node)`: whether the node is still in the cluster (a node deleted takes its
        turns with it: its release is not sent again)."""
        self._links = links
        self._epoch = epoch
        self._known = known
        self._tasks: set[asyncio.Task[None]] = set()

    async def release(
        self,
        nodes: dict[str, str],
        epoch: int,
        turn_id: str,
        reason: str,
        wait_s: float,
        wait_for: Collection[str] | None = None,
    ) -> list[str]:
        """Release `turn_id` on `nodes`; wait up to `wait_s` for those of `wait_for` (all if
        None). Returns the nodes waited for that had not answered by then; every release goes on
        until its node answers."""
        tasks = {
            node: self._spawn(node, address, epoch, turn_id, reason)
            for node, address in nodes.items()
        }
        waited = {n: t for n, t in tasks.items() if wait_for is None or n in wait_for}
        if not waited:
            return []
        await asyncio.wait(waited.values(), timeout=wait_s)
        late = sorted(node for node, task in waited.items() if not task.done())
        if late:
            log.warning("turn %s: nodes %s have not answered its release yet", turn_id, late)
        return late

    def _spawn(
        self, node: str, address: str, epoch: int, turn_id: str, reason: str
    ) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(
            self._until_heard(node, address, epoch, turn_id, reason)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _until_heard(
        self, node: str, address: str, epoch: int, turn_id: str, reason: str
    ) -> None:
        backoff, tries = FIRST_BACKOFF_S, 0
        while True:
            try:
                await self._links.release(node, address, epoch, turn_id, reason)
                if tries:
                    log.info("turn %s: released on node %s after %d retries", turn_id, node, tries)
                return
            except NodeFailed as err:
                if err.code == grpc.StatusCode.FAILED_PRECONDITION or self._epoch() != epoch:
                    log.info("turn %s on %s: left to the newer leader (%s)", turn_id, node, err.why)
                    return
                if not self._known(node):
                    log.info("turn %s: node %s left the cluster; release dropped", turn_id, node)
                    return
                level = logging.WARNING if tries % 20 == 0 else logging.DEBUG
                log.log(
                    level,
                    "turn %s: release on node %s failed (%s); sending it again until it is heard",
                    turn_id, node, err.why,
                )  # fmt: skip
            tries += 1
            await asyncio.sleep(backoff)  # the agent is away: back off before asking again
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def close(self) -> None:
        """Stop sending (this replica stops leading or stops)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def rolled_back(behind: list[str]) -> str:
    """What a failed turn's caller hears of its roll-back, `behind` the nodes not heard yet."""
    if not behind:
        return "rolled back on every node"
    return f"rolled back on every node; on {', '.join(behind)} until its agent answers"
