"""Whose turn it is, cluster-wide: the agent's own lease table (`agent.core.leases`) over every
node's GPUs, each job (and llm-d group) one tenant of it, each grant carried out in two phases.

A job's waiter is reserved by the table's policy (fifo or fair, tiers and accounting, as on a
node) when all its GPUs are free of other jobs; then every member node prepares (makes room and
restores: the two phases on the nodes are `coordinator.handover`'s). Once all have, the turn is
decided: the waiter hears it, and every node is told to commit (which records the decision). A
failed prepare rolls the others back and the waiter hears which node failed and why. The table
never gives two jobs a GPU at once, and each agent holds its node to one turn per GPU, so a
job's pods never compute beside another job's on one GPU even while a release is still on its
way to a node.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from agent.core.leases import Lease, LeaseTable
from agent.core.waiters import Waiter
from coordinator import handover
from coordinator.agents import AgentLinks
from coordinator.cluster import ClusterView, Plan, turn_key
from coordinator.departed import forget_departed
from coordinator.jobturn import Asked, JobTurn, NotLeading, TurnFailed, late, not_holder, time_left
from coordinator.overlap import holding
from coordinator.releases import Releases
from coordinator.settling import Settling

if TYPE_CHECKING:
    from coordinator.recovery import Recovered

log = logging.getLogger(__name__)

PREPARE_TIMEOUT_S = 60.0
"""How long a node may take to make room for a job (its holder's turn ending included)."""
RELEASE_WAIT_S = 5.0
"""How long a yield waits for its nodes' releases (the ones that are late go on behind)."""


@dataclass
class Arbiter:
    """Queues and grants job turns while this replica leads (`epoch` > 0)."""

    view: ClusterView
    links: AgentLinks
    new_table: Callable[[], LeaseTable]
    """A fresh table (the policy's), made each time this replica starts to lead."""
    clock: Callable[[], float]
    prepare_timeout_s: float = PREPARE_TIMEOUT_S
    release_wait_s: float = RELEASE_WAIT_S
    epoch: int = 0
    held: dict[str, JobTurn] = field(default_factory=dict)
    table: LeaseTable = field(init=False)
    on_granted: Callable[[float], None] = lambda seconds: None
    """Hears each grant, with how long its handover took (`coordinator.status`)."""
    on_failed: Callable[[str], None] = lambda node: None
    """Hears each turn rolled back, with the node that failed first."""
    on_pruned: Callable[[], None] = lambda: None
    """Hears each prune: nodes may have gone (`coordinator.status` drops their series)."""
    changed_at: dict[str, float] = field(default_factory=dict)
    """GPU (`node/GPU`) → when its turn last started, began moving or ended."""
    settling: Settling = field(default_factory=Settling)
    """The nodes heard since this replica leads: only those are planned onto."""
    _waits: dict[str, Asked] = field(default_factory=dict)
    _by_key: dict[str, str] = field(default_factory=dict)
    """job key → the waiter id of its turn being asked for"""
    releases: Releases = field(init=False)
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    _joins: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    """Numbers each join (its id is the epoch and this: unique across leaders)."""
    _timer: asyncio.TimerHandle | None = None

    def __post_init__(self) -> None:
        self.table = self.new_table()
        self.releases = Releases(
            self.links, lambda: self.epoch, lambda node: node in self.view.addresses()
        )

    # Asking.

    async def acquire(
        self,
        namespace: str,
        job: str,
        group: str,
        timeout: float | None,
        share: bool = True,
        every: bool = False,
    ) -> JobTurn:
        """Wait for the job's turn on `group` (all its pods if ""), at once if held or (`share`)
        covered by its turn on another group (`coordinator.overlap`); `every`: see `yield_`."""
        self.check_leading()
        replan = partial(self.view.plan, namespace, job, group)
        plan = replan()
        if plan.key not in self.held:  # an unheard node may hold an older leader's turn
            plan, timeout = await self.settling.wait(plan, timeout, replan)
        if turn := holding(plan, self.held, (w.plan for w in self._waits.values()), share):
            self.held[plan.key] = turn
            turn.waited, turn.restored = 0.0, False  # this call waited for and restored nothing
            return turn
        waiter_id = self._by_key.get(plan.key, "")
        wait = self._waits.get(waiter_id)
        if wait is not None:  # asked for already: wait for the same turn
            future = wait.ask()
            wait.abandoned = False  # a turn being prepared for a call gone (a retry) goes on
        else:
            waiter = self.table.enqueue(plan.key, plan.resources, duty=plan.duty, tier=plan.tier)
            waiter_id = waiter.waiter_id
            wait = Asked(plan)
            future = wait.ask()
            self._waits[waiter_id] = wait
            self._by_key[plan.key] = waiter_id
            self._dispatch()
        asked = self.clock()
        try:
            async with asyncio.timeout(timeout):
                turn = await future
        except TimeoutError:
            if not future.done() or future.cancelled():
                held, waiters = self.held.values(), self.table.waiters.values()
                error = late(plan, held, waiters, wait.moving, None if every else namespace)
                self._abandon(waiter_id, future)
                raise error from None
            turn = future.result()  # decided (or failed: raised) as the deadline came
        except asyncio.CancelledError:
            self._abandon(waiter_id, future)
            raise
        turn.waited = max(0.0, turn.granted_at - asked)
        return turn

    async def yield_(self, namespace: str, job: str, group: str, every: bool = False) -> int:
        """End the job's turn on every node; returns how many other jobs wait for its GPUs
        (NotHolder names another namespace's holder only for a caller that sees `every` job)."""
        self.check_leading()
        key = turn_key(namespace, job, group)
        turn = self.held.pop(key, None)
        if turn is None:
            holder = self.holder_of(self.view.plan(namespace, job, group).resources)
            raise not_holder(key, holder.key if holder else "", None if every else namespace)
        waiting = {
            w.tenant_id for w in self.table.waiters.values() if set(w.gpus) & set(turn.resources)
        }
        if any(other is turn for other in self.held.values()):  # held for another group too
            return len(waiting)
        turn.ended.set()
        self.table.release(turn.lease_id, yielded=True)
        self._changed(turn.resources)
        self._dispatch()  # the next job's prepare queues on each node behind this release
        await self.releases.release(
            turn.nodes, self.epoch, turn.turn_id, "yielded", self.release_wait_s
        )
        return len(waiting)

    def prune_joined(self) -> None:
        """Pods of a turn that left the cluster leave it (the last one ends it; a turn none of
        whose pods is left ends), and jobs and nodes gone leave the table (`coordinator.departed`).
        Not before every pods' watch has listed once: a pod not listed yet has not left."""
        if not self.epoch or not self.view.wait_listed(0.0):
            return
        forget_departed(self, {*self.held, *self._by_key})
        pods = self.view.pods()
        for key, turn in list(self.held.items()):
            if turn.pods and not turn.pods & pods:
                log.info("job %s: every pod of its turn left the cluster; the turn ends", key)
                self._yield_later(key)
                continue
            gone = {pod for pod in turn.joined if pod not in pods}
            if not gone:
                continue
            turn.joined -= gone
            log.info("job %s: pods %s left the cluster, and its turn", turn.key, sorted(gone))
            if not turn.joined:
                self._yield_later(turn.key)

    def _yield_later(self, key: str) -> None:
        turn = self.held.get(key)
        if turn is None:
            return
        group = key.partition("@")[2]
        task = asyncio.get_running_loop().create_task(self.yield_(turn.namespace, turn.job, group))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def join(
        self, namespace: str, job: str, group: str, pod: str, timeout: float | None
    ) -> JobTurn:
        """A member pod asks for its job's turn itself; the turn ends when all who joined left.
        A pod that became a member after the held turn was prepared joins the next one."""
        deadline = None if timeout is None else self.clock() + timeout
        while True:
            # Not on another group's turn: the pods that joined end theirs by its own key.
            left = time_left(deadline, self.clock())
            turn = await self.acquire(namespace, job, group, left, share=False)
            if pod in turn.pods:
                turn.joined.add(pod)
                turn.joins[pod] = f"{self.epoch}.{next(self._joins)}"
                return turn
            try:  # the pods in this turn end it; the next one is prepared for this pod too
                await asyncio.wait_for(turn.ended.wait(), time_left(deadline, self.clock()))
            except TimeoutError:
                raise TimeoutError(
                    f"job {turn.key}: pod {pod} became its member after its turn began, so it "
                    "joins the next one; this one's pods had not all yielded by the deadline"
                ) from None

    async def leave(
        self, namespace: str, job: str, group: str, pod: str, turn_id: str = "", join_id: str = ""
    ) -> bool:
        """A member pod leaves its job's turn; True if it ended (the last pod, no group held).
        A leave naming another turn (`turn_id`) or an earlier join of the pod's (`join_id`) is
        one sent before the pod joined again, which reached here late: it is ignored. Neither
        named (an older agent): the pod leaves the turn it is in."""
        self.check_leading()
        turn = self.held.get(turn_key(namespace, job, group))
        if turn is None or pod not in turn.joined:
            return False
        latest = turn.joins.get(pod, "")  # "": a pod a new leader found joined (unknown)
        if (turn_id and turn_id != turn.turn_id) or (join_id and latest not in ("", join_id)):
            log.info(
                "job %s: pod %s's leave of turn %s (join %s) came after it joined turn %s "
                "again (join %s): ignored",
                turn.key, pod, turn_id, join_id, turn.turn_id, latest,
            )  # fmt: skip
            return False
        turn.joined.discard(pod)
        turn.joins.pop(pod, None)
        if turn.joined:
            return False
        await self.yield_(namespace, job, group)
        return not any(other is turn for other in self.held.values())

    def holder_of(self, resources: Iterable[str]) -> JobTurn | None:
        """The job turn holding any of `resources`, if one does."""
        wanted = set(resources)
        return next((t for t in self.held.values() if wanted & set(t.resources)), None)

    def switching(self, resources: Iterable[str]) -> str:
        """The job whose turn on `resources` is being prepared now, or ""."""
        wanted = set(resources)
        for waiter_id, wait in self._waits.items():
            waiter = self.table.waiters.get(waiter_id)
            if wait.moving and waiter is not None and wanted & set(waiter.gpus):
                return waiter.tenant_id
        return ""

    def waiting(self, resources: Iterable[str]) -> int:
        """How many job turns wait for any of `resources` (those being prepared not counted)."""
        wanted = set(resources)
        return sum(
            1 for w in self.table.waiters.values() if not w.reserved and wanted & set(w.gpus)
        )

    # Leading.

    def lead(self, epoch: int, table: LeaseTable, found: Recovered) -> None:
        """This replica leads from now, with `epoch`, holding what `coordinator.recovery` found
        (the agents that answered it are planned onto; the others once they answer)."""
        self.table, self.held, self.epoch = table, found.held, epoch
        self.settling.lead(found.answered, found.unreachable)

    def step_down(self, reason: str) -> None:
        """This replica no longer leads: every waiter hears why; the next leader takes over."""
        self.epoch = 0
        for turn in self.held.values():
            turn.ended.set()
        for wait in self._waits.values():
            wait.fail(NotLeading(f"the coordinator stepped down: {reason}"))
        for task in self._tasks:
            task.cancel()
        self._waits.clear()
        self._by_key.clear()
        self.held.clear()
        self.settling.clear()
        self.table = self.new_table()

    def check_leading(self) -> None:
        """NotLeading unless this replica leads."""
        if not self.epoch:
            raise NotLeading("this coordinator replica is not the leader; ask the Service again")

    # Granting.

    def _dispatch(self) -> None:
        for waiter in self.table.pick():
            wait = self._waits.get(waiter.waiter_id)
            if wait is None:  # a reservation nobody waits for any more
                self.table.cancel(waiter.waiter_id)
                continue
            wait.moving = True
            self._changed(waiter.gpus)
            task = asyncio.create_task(self._handover(waiter, wait))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._reschedule()

    def _reschedule(self) -> None:
        """Wake when time alone can change whom the table picks (a fair hold running out)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = self.clock()
        due = self.table.next_deadline(after=now)
        if due is not None:
            self._timer = asyncio.get_running_loop().call_later(due - now, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.table.tick()
        self._dispatch()

    async def _handover(self, waiter: Waiter, wait: Asked) -> None:
        plan, epoch, began = self.view.handed(wait.plan), self.epoch, self.clock()
        turn_id = uuid.uuid4().hex[:16]
        prepared, failed = await handover.prepare(
            self.links, plan, epoch, turn_id, self.prepare_timeout_s
        )
        if prepared is None or wait.abandoned or epoch != self.epoch:
            if failed:
                self.on_failed(failed[0][0])
            # The waiter hears the failure once the nodes that answered are rolled back (a job
            # that asks again, or looks, finds its pods holding nothing there).
            why = await handover.roll_back(
                self.releases, plan, epoch, turn_id, failed, self.release_wait_s
            )
            self._end_wait(waiter.waiter_id, TurnFailed(why))
            return
        # Prepared on every node: decided (a new leader would hold it too). The waiter hears it
        # now; the commits that record it go out behind.
        lease = self.table.grant(waiter.waiter_id)
        self._waits.pop(waiter.waiter_id, None)
        self._by_key.pop(plan.key, None)
        turn = self._turn_of(plan, lease, turn_id)
        turn.restored = any(t.restored for t in prepared.values())
        self.held[plan.key] = turn
        self._changed(turn.resources)
        self.on_granted(self.clock() - began)
        wait.grant(turn)
        self._reschedule()
        await handover.commit(
            self.links, plan, epoch, turn_id, lambda: self.held.get(plan.key) is turn
        )

    def _turn_of(self, plan: Plan, lease: Lease, turn_id: str) -> JobTurn:
        return JobTurn(
            key=plan.key,
            turn_id=turn_id,
            lease_id=lease.lease_id,
            namespace=plan.namespace,
            job=plan.job,
            group=plan.group,
            nodes=dict(plan.addresses),
            granted_at=lease.granted_at,
            resources=lease.gpus,
            pods=frozenset(pod for pods in plan.pods.values() for pod in pods),
        )

    def _changed(self, resources: Iterable[str]) -> None:
        now = self.clock()
        for resource in resources:
            self.changed_at[resource] = now

    def _end_wait(self, waiter_id: str, error: Exception) -> None:
        wait = self._waits.pop(waiter_id, None)
        if wait is not None and self._by_key.get(wait.plan.key) == waiter_id:
            del self._by_key[wait.plan.key]
        self.table.cancel(waiter_id)
        if wait is not None:
            wait.fail(error)
        self._dispatch()

    def _abandon(self, waiter_id: str, future: asyncio.Future[JobTurn]) -> None:
        wait = self._waits.get(waiter_id)
        if wait is None:
            return
        if wait.leave(future):  # another call still waits for this turn
            return
        if wait.moving:
            wait.abandoned = True  # the handover rolls back and ends the wait
            return
        self._waits.pop(waiter_id, None)
        if self._by_key.get(wait.plan.key) == waiter_id:
            del self._by_key[wait.plan.key]
        if self.table.cancel(waiter_id) is not None:
            self._dispatch()

    async def close(self) -> None:
        """Stop the timer, every handover and every release in flight."""
        if self._timer is not None:
            self._timer.cancel()
        await self.releases.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
