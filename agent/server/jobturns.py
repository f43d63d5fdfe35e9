"""A job's turn on this node, as the cluster coordinator drives it: prepare, commit, release.

A job's member pods on this node take the node's turn together: Prepare asks the lease service
for each member's turn on its GPUs (the agent makes room and restores it, as for any grant, and
the node's policy orders it among the node's other tenants), Commit marks it started, Release
ends it. While the job's turn lives, each member counts as having a session (the coordinator
watches the job, not the agent), so a pod that only computes keeps its turn.

Every call carries the leader's epoch; the agent refuses one older than the highest it has
seen, or that one from another leader (`agent.server.jobturn_fence`), so a deposed leader cannot
act. The fence and the turns are kept on disk (`agent.node.jobturn_store`); the turns are taken
up again after an agent restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from agent.core.errors import AgentError, UnknownLease
from agent.core.leases import Lease
from agent.node.jobturn_store import JobTurnStore
from agent.node.tenants import POD, Tenant
from agent.server.jobturn_fence import Fence, NotRecorded, StaleEpoch
from agent.server.jobturn_prepare import CoordinatedSession, Preparation, PrepareFailed, own_gpus
from agent.server.node_turn import COMMITTED, NodeTurn
from agent.server.service import LeaseService
from agent.server.sessions import Session
from agent.server.waits import standing
from baton.contract.names import job_of_labels

__all__ = ["JobTurns", "NoMembers", "NotRecorded", "StaleEpoch", "UnknownTurn"]

log = logging.getLogger(__name__)


class NoMembers(AgentError):
    """The job has no pod with GPUs on this node (NOT_FOUND)."""


class UnknownTurn(AgentError):
    """No such job turn on this node (NOT_FOUND)."""


class JobTurns:
    """The job turns of this node, over the lease service."""

    def __init__(
        self, service: LeaseService, node: str, store: JobTurnStore, clock: Callable[[], float]
    ) -> None:
        self.service = service
        self.node = node
        self._store = store
        self._clock = clock
        self._fence = Fence(node, store)
        self.turns: dict[str, NodeTurn] = {}
        self._preparing: dict[str, Preparation] = {}
        self._dirty = False
        """The turns here changed since they were last written."""
        service.turns.resumes.follow = self._resumed

    def load(self) -> None:
        """Take up the fence and the turns saved before a restart, whose leases still live."""
        self._fence.load()
        for data in self._store.load_turns():
            try:
                turn = NodeTurn.from_json(data)
            except (TypeError, KeyError, ValueError) as exc:
                log.error("a saved job turn is unusable (%s): dropped", exc)
                continue
            table = self.service.table
            if any(x in table.leases or x in table.waiters for x in turn.leases):  # or a resume
                self._attach(turn)  # a member whose pod left meanwhile is simply gone from it
                self.turns[turn.turn_id] = turn
            else:
                log.warning(
                    "job %s/%s: turn %s ended while the agent was down; not taken up",
                    turn.namespace, turn.job, turn.turn_id,
                )  # fmt: skip
                self._end_leases(turn, "its turn ended while the agent was down")
        self._save()

    def close(self) -> None:
        """Close the turns' file (the turns stay on disk for the next agent)."""
        self._store.close()

    # Commands.

    @property
    def epoch(self) -> int:
        """The highest epoch seen: commands from an older one are refused."""
        return self._fence.epoch

    @property
    def holder(self) -> str:
        """The identity of the leader obeyed in `epoch` ("" until one names itself)."""
        return self._fence.holder

    def fence(self, epoch: int, holder: str = "") -> None:
        """`StaleEpoch` for an older epoch, or this one from another `holder`; a newer one (or
        the first holder named in this one) is recorded durably before answering."""
        self._fence.check(epoch, holder)

    async def prepare(
        self,
        epoch: int,
        turn_id: str,
        namespace: str,
        job: str,
        timeout: float | None,
        pods: Sequence[str] = (),
        group: str = "",
        nodes: Sequence[str] = (),
        on_prepared: Callable[[NodeTurn], None] | None = None,
        holder: str = "",
    ) -> NodeTurn:
        """Every member's turn granted (room made, memory restored); idempotent per turn id.
        `pods` names the members whose turn it is (default: every pod of the job here).
        `on_prepared` hears of the turn as it is made, in the step of the last member's grant
        (`agent.server.jobturn_prepare`), which can be before this returns. `holder`: the
        leader's identity (`fence`)."""
        self.fence(epoch, holder)
        if not turn_id or not namespace or not job:
            raise PrepareFailed("turn_id, namespace and job are required")
        if turn_id in self.turns:
            return self.turns[turn_id]
        preparation = self._preparing.get(turn_id)
        if preparation is None:
            members = self.members(namespace, job)
            if not members:
                raise NoMembers(f"job {namespace}/{job} has no pod with GPUs on node {self.node}")
            if pods:
                strangers = sorted(set(pods) - {m.tenant_id for m in members})
                if strangers:
                    raise NoMembers(
                        f"{', '.join(strangers)}: no pod of job {namespace}/{job} with GPUs "
                        f"on node {self.node}"
                    )
                members = [m for m in members if m.tenant_id in set(pods)]
            own_gpus(members, namespace, job, self.node)
            self._end_older(turn_id, namespace, job, group, {m.tenant_id for m in members})
            whose = (namespace, job, group)
            preparation = Preparation(self, epoch, turn_id, whose, members, nodes, timeout)
            self._preparing[turn_id] = preparation
            preparation.task.add_done_callback(lambda _: self._preparing.pop(turn_id, None))
        if on_prepared is not None:
            preparation.listeners.append(on_prepared)
        return await preparation.task  # a caller that gives up (deadline, disconnect) cancels it

    def add(self, turn: NodeTurn) -> None:
        """Record a prepared turn (on disk before anyone hears of it); the turns here that
        held its GPUs end."""
        self._end_overtaken(turn)
        dirty = self._dirty  # all that waits to be written once the turn is withdrawn
        self.turns[turn.turn_id] = turn
        try:
            self._save(strict=True)
        except OSError:
            del self.turns[turn.turn_id]
            self._dirty = dirty  # its roll-back has nothing to record
            raise

    def _end_older(
        self, turn_id: str, namespace: str, job: str, group: str, pods: set[str]
    ) -> None:
        """End the job's turns still held here on the same group, or on any group with one of
        the new turn's `pods`: the coordinator prepares the job's next turn on a group only once
        that one is over, and never one that shares a pod with a turn the job holds (a turn on
        a group it covers is that turn), so their release went unheard (the agent restarting, a
        leader change). Their members would otherwise still hold, or wait to be given back, the
        GPUs the new turn asks for, and the prepare would fail on them."""
        older = [
            t
            for t in self.turns.values()
            if (t.namespace, t.job) == (namespace, job)
            and (t.group == group or not pods.isdisjoint(t.members))
        ]
        for old in older:
            why = f"the job's turn {turn_id} is being prepared; its release was not heard"
            self._end(old.turn_id, why, unheard=True)
        if older:
            self._save()  # (a full disk: written with the new turn, or the next change)

    def _end_overtaken(self, turn: NodeTurn) -> None:
        """End each turn here that names a GPU `turn` was granted: the coordinator gave it to
        `turn`, so that one's release went unheard (its member was revoked at the maximum hold)."""
        for old in [t for t in self.turns.values() if set(t.gpus) & set(turn.gpus)]:
            why = f"its GPUs went to job {turn.namespace}/{turn.job}'s turn {turn.turn_id}"
            self._end(old.turn_id, f"{why}; its release was not heard", unheard=True)

    def commit(self, epoch: int, turn_id: str, holder: str = "") -> NodeTurn:
        """The prepared turn starts; idempotent."""
        self.fence(epoch, holder)
        turn = self.turns.get(turn_id)
        if turn is None:
            raise UnknownTurn(f"node {self.node} has no prepared turn {turn_id!r} to commit")
        if turn.state != COMMITTED:
            turn.state, turn.committed_at = COMMITTED, self._clock()
            self._dirty = True
        self._recorded(f"turn {turn_id} started here")
        return turn

    def preparation(self, turn_id: str) -> asyncio.Task[NodeTurn] | None:
        """The preparation of `turn_id` still running, if any (a release cancels it; it gives
        back what its members were granted as it ends)."""
        preparation = self._preparing.get(turn_id)
        return preparation.task if preparation is not None else None

    def release(self, epoch: int, turn_id: str, reason: str, holder: str = "") -> bool:
        """End the turn (prepared or committed) or its preparation; False if there was none.
        `NotRecorded` if its end cannot be written: it has ended here all the same, and the
        release sent again is answered once it is written."""
        self.fence(epoch, holder)
        released = self._end(turn_id, reason)
        self._recorded(f"turn {turn_id} ended here")
        return released

    def _end(self, turn_id: str, reason: str, unheard: bool = False) -> bool:
        """End the turn or its preparation here (not yet on disk); False if there was none.
        `unheard`: ended for a release the node never heard (logged as a warning)."""
        task = self.preparation(turn_id)
        if task is not None:
            task.cancel()  # its acquires leave the queue, or give back what they were granted
        turn = self.turns.pop(turn_id, None)
        if turn is None:
            return task is not None
        log.log(
            logging.WARNING if unheard else logging.INFO,
            "job %s/%s: turn %s released (%s)",
            turn.namespace, turn.job, turn_id, reason or "no reason given",
        )  # fmt: skip
        self._end_leases(turn, reason)
        for session in turn.sessions:
            self.service.sessions.close(session)
        self._dirty = True
        return True

    def report(self, epoch: int, holder: str = "") -> list[NodeTurn]:
        """The job turns held here, raising the fence to `epoch` if it is newer (or naming its
        `holder` where none was). An older epoch, or this one from another holder, only reads
        (it changes nothing): a new leader learns the agents' epochs (and holders) so."""
        if self._fence.raises(epoch, holder):
            self.fence(epoch, holder)
        return list(self.turns.values())

    # Members that ask themselves (`agent.server.coordinated`).

    def lease_of(self, tenant_id: str, turn_id: str = "") -> tuple[NodeTurn, str] | None:
        """The turn (`turn_id`'s, else a committed one) that covers the member, and the
        member's lease id in it."""
        for turn in self.turns.values():
            chosen = turn.turn_id == turn_id if turn_id else turn.state == COMMITTED
            if chosen and tenant_id in turn.members:
                lease_id = turn.lease_of(tenant_id)
                if lease_id in self.service.table.leases:
                    return turn, lease_id
        return None

    def turn_of_lease(self, tenant_id: str, lease_id: str) -> NodeTurn | None:
        """The turn in which `lease_id` is the member's lease (or was, until the node revoked it:
        the turn it was given back in is the member's in the job's turn all the same). No
        `lease_id`: the turn the member joined (a client names none while its revoked turn
        waits to be given back)."""
        for turn in self.turns.values():
            if turn.names(tenant_id, lease_id) if lease_id else tenant_id in turn.joined:
                return turn
        return None

    async def given_back(self, tenant_id: str, turn_id: str, within: float) -> str:
        """Why the node has not given the member its GPUs back in `turn_id` (it revoked the
        member's lease there, and the turn that gives it back waits), or "" if it has not; such
        a turn is waited for first, until it leaves the queue or `within` seconds pass."""
        turn = self.turns.get(turn_id)
        if turn is None or tenant_id not in turn.members:
            return ""
        table = self.service.table
        if (waiter := table.waiters.get(turn.lease_of(tenant_id))) is not None and within > 0:
            await self.service.turns.resumes.left(waiter.waiter_id, within)
            waiter = table.waiters.get(waiter.waiter_id)
        if waiter is None:
            return ""
        return str(standing(table, self.service.metrics, waiter, self._clock())["why"])

    def now(self) -> float:
        """The time on the clock the turns' times are on."""
        return self._clock()

    def lease(self, lease_id: str) -> Lease | None:
        """A member's lease, as the lease table holds it (None once it ended)."""
        return self.service.table.leases.get(lease_id)

    def has_own_session(self, tenant_id: str) -> bool:
        """Whether the member has a session of its own (not only the turn's stand-in)."""
        return self.service.sessions.connected_besides(tenant_id, CoordinatedSession)

    def tenant(self, tenant_id: str) -> Tenant | None:
        return self.service.tenants.tenants.get(tenant_id)

    def mark_joined(self, turn: NodeTurn, tenant_id: str, joined: bool, join_id: str = "") -> None:
        """Record that the member joined (as the coordinator's `join_id`) or left (`leaving`
        until heard) the turn itself."""
        if joined and (tenant_id not in turn.joined or turn.joins.get(tenant_id) != join_id):
            if tenant_id not in turn.joined:
                turn.joined.append(tenant_id)
            turn.leaving = [pod for pod in turn.leaving if pod != tenant_id]
            turn.joins[tenant_id] = join_id
        elif not joined and tenant_id in turn.joined:
            turn.joined.remove(tenant_id)
            turn.leaving.append(tenant_id)
        else:
            return
        self._save()

    def left_heard(self, turn: NodeTurn, tenant_id: str) -> None:
        """The coordinator heard the member leave the turn (or it was given up on)."""
        if tenant_id in turn.leaving:
            turn.leaving.remove(tenant_id)
            self._save()

    def _resumed(self, tenant_id: str, revoked: str, resume: str) -> None:
        """The node revoked a member's lease (its maximum hold): the turn that gives it back
        is the member's in its job's turn, here and on disk."""
        for turn in self.turns.values():
            if turn.follow(tenant_id, revoked, resume):
                log.info(
                    "job %s/%s: turn %s: pod %s's lease %s was revoked; %s gives it back",
                    turn.namespace, turn.job, turn.turn_id, tenant_id, revoked, resume,
                )  # fmt: skip
                self._save()
                return

    # Members.

    def members(self, namespace: str, job: str) -> list[Tenant]:
        """The job's pods with GPUs on this node, in name order."""
        return sorted(
            (
                t
                for t in self.service.tenants.tenants.values()
                if t.source == POD
                and t.tenant_id.startswith(f"{namespace}/")
                and job_of_labels(t.labels) == job
            ),
            key=lambda t: t.tenant_id,
        )

    def open_session(self, tenant_id: str, turn_id: str) -> Session:
        """The member's stand-in session for the turn `turn_id`."""
        session = CoordinatedSession(tenant_id, pid=0, token=f"job-turn:{turn_id}")
        self.service.sessions.open(session)
        # The coordinator decides the member's next turn: the node's policy keeps no GPU for it.
        self.service.table.anticipation.decided_elsewhere(tenant_id)
        return session

    def _attach(self, turn: NodeTurn) -> None:
        turn.sessions = [self.open_session(member, turn.turn_id) for member in turn.members]

    def _end_leases(self, turn: NodeTurn, reason: str) -> None:
        for member, lease_id in zip(turn.members, turn.leases, strict=True):
            self.yield_member(member, lease_id)

    def yield_member(self, member: str, lease_id: str) -> None:
        """The member's turn `lease_id` ends, if it still lives."""
        tenant = self.service.tenants.tenants.get(member)
        if tenant is None:
            return  # its pod left: its turn went with it
        # It may have ended already (revoked and not given back, or its pod's session ended).
        with contextlib.suppress(UnknownLease):
            self.service.yield_(tenant, lease_id)

    def _recorded(self, done: str) -> None:
        """The turns on disk as they are here, before a command that changed them is answered;
        `NotRecorded` (saying what was `done` here all the same) if they cannot be written."""
        if self._dirty and not self._save():
            raise NotRecorded(
                f"{done} but could not be recorded ({self._store.failing}); "
                "the same call is answered once it can"
            )

    def _save(self, strict: bool = False) -> bool:
        """Write the turns held here; whether they were (`JobTurnStore.record`): the next change
        that can be written catches up."""
        self._dirty = True  # until written (a strict save that fails raises here)
        if self._store.record([t.to_json() for t in self.turns.values()], strict):
            self._dirty = False
        return not self._dirty
