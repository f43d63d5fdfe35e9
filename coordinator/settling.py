"""Which nodes' agents have answered this leader, and the jobs that wait for the others.

A node whose agent a new leader has not heard (it did not answer, or the view listed it only
after the leader took over) may still hold a job turn of an older leader, which the leader's
table does not show yet (`coordinator.recovery`). So no turn is planned onto such a node: a job
with a member there waits until the node has answered, and hears which node and why.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from coordinator.cluster import Plan
from coordinator.jobturn import NotLeading

log = logging.getLogger(__name__)

LATE = "its agent was listed after this leader took over: its job turns are not asked for yet"
"""Why a node is unsettled before this leader first asks it."""


class Settling:
    """The nodes this leader has heard, the ones it has not (and why), and who waits for them."""

    def __init__(self) -> None:
        self.unsettled: dict[str, str] = {}
        """node → why its agent has not answered this leader yet (`coordinator.recovery`)."""
        self.heard: set[str] = set()
        """The nodes whose agents answered this leader: their job turns are settled."""
        self._news = asyncio.Event()
        self._leading = False

    def lead(self, heard: Iterable[str], unsettled: Mapping[str, str]) -> None:
        """A new term: `heard` answered the leader's recovery, `unsettled` did not (why)."""
        self.heard, self.unsettled, self._leading = set(heard), dict(unsettled), True
        self._wake()

    def settled(self, node: str, heard: bool = True) -> None:
        """The node's agent answered and its job turns are settled (`heard`), or it left the
        cluster or obeys a newer leader (not `heard`): it is no longer named unsettled."""
        self.unsettled.pop(node, None)
        if heard:
            self.heard.add(node)
        self._wake()

    def clear(self) -> None:
        """The term ends: nobody is heard; the jobs waiting look again (and hear why)."""
        self.heard.clear()
        self.unsettled.clear()
        self._leading = False
        self._wake()

    def why_waits(self, plan: Plan) -> str:
        """Why the plan may not be prepared yet (its unheard nodes, each with why), or ""."""
        return "; ".join(
            f"node {node} has not reported its job turns to this leader "
            f"({self.unsettled.get(node, LATE)})"
            for node in sorted(plan.pods)
            if node not in self.heard
        )

    async def wait(
        self, plan: Plan, timeout: float | None, replan: Callable[[], Plan]
    ) -> tuple[Plan, float | None]:
        """The plan (made again by `replan` after each change) once every node of it was heard,
        with what is left of `timeout`; TimeoutError saying which node it waited for."""
        deadline = None if timeout is None else time.monotonic() + timeout
        told = ""
        while why := self.why_waits(plan):
            if why != told:
                log.info("job %s waits before its turn is planned: %s", plan.key, why)
                told = why
            news = self._news
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                await asyncio.wait_for(news.wait(), left)
            except TimeoutError:
                raise TimeoutError(f"job {plan.key}: no turn before the deadline; {why}") from None
            if not self._leading:
                raise NotLeading("the coordinator stepped down while the job waited")
            plan = replan()
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return plan, left

    def _wake(self) -> None:
        self._news.set()
        self._news = asyncio.Event()
