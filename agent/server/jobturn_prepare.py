"""Preparing a job's turn on this node: each member pod's turn asked of the lease service, and
the job turn made as the last of them is granted.

The turn is made, saved and told to whoever waits for it (`Preparation.listeners`: the
coordinator's link writes its answer then) in the event-loop step of the last member's grant,
as a direct session's grant is written in the step that freed the GPU; the members' acquires end
a few steps later. A member granted at once (a turn owed to it, which no grant announces) is
taken up when its acquire returns, and the turn made then.

A preparation cancelled before its turn is made (a release, the coordinator's cancel, its
connection's end) leaves nothing behind: its waiting members leave the queue and those granted
give their turns back. Once made, the turn stands as any prepared turn does (a release ends it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from agent.core.errors import AgentError
from agent.core.leases import Lease, Waiter
from agent.core.residency import parked_on
from agent.node.tenants import Tenant
from agent.server.node_turn import NodeTurn
from agent.server.sessions import Session
from agent.server.turn_state import Granted
from baton._pb import agent_pb2 as pb
from baton.contract.tasks import to_the_end

if TYPE_CHECKING:
    from agent.server.jobturns import JobTurns

log = logging.getLogger(__name__)


class PrepareFailed(AgentError):
    """A member's turn could not be prepared; the message names the pod and why."""


def own_gpus(members: list[Tenant], namespace: str, job: str, node: str) -> None:
    """PrepareFailed if two members share a GPU: a turn is one lease per GPU, so the second
    would wait for the first's forever."""
    seen: dict[str, str] = {}
    for member in members:
        for gpu in member.gpus:
            other = seen.setdefault(gpu, member.tenant_id)
            if other != member.tenant_id:
                raise PrepareFailed(
                    f"pods {other} and {member.tenant_id} of job {namespace}/{job} share GPU "
                    f"{gpu} on node {node}: a job's turn needs each of its pods on GPUs of its own"
                )


class CoordinatedSession(Session):
    """A member pod's stand-in session while its job's turn lives: the coordinator watches it."""

    def send(self, message: pb.AgentMessage) -> None:
        """Pushes go to the pod's own sessions, if it has any; nothing reads this one."""


class Preparation:
    """One job turn being prepared here, on a task of its own (`task`) from its making."""

    def __init__(
        self,
        turns: JobTurns,
        epoch: int,
        turn_id: str,
        whose: tuple[str, str, str],
        members: list[Tenant],
        nodes: Sequence[str],
        timeout: float | None,
    ) -> None:
        self._turns = turns
        self.epoch, self.turn_id = epoch, turn_id
        self.namespace, self.job, self.group = whose
        self.members = members
        self.nodes = tuple(nodes)
        self.granted: dict[str, Lease] = {}
        self.turn: NodeTurn | None = None
        """The turn, once made."""
        self.listeners: list[Callable[[NodeTurn], None]] = []
        """Told of the turn as it is made."""
        self._sessions: list[Session] = []
        self._restored = False
        self.task: asyncio.Task[NodeTurn] = asyncio.create_task(self.run(timeout))

    async def run(self, timeout: float | None) -> NodeTurn:
        """Every member's turn granted (room made, memory restored); the turn, made."""
        turns, service = self._turns, self._turns.service
        await self._after_forgets()
        residency = service.preparer.residency_of
        self._restored = any(parked_on(residency(m.tenant_id), m.gpus) for m in self.members)
        self._sessions = [turns.open_session(m.tenant_id, self.turn_id) for m in self.members]
        asks = [
            asyncio.ensure_future(
                service.acquire(m, m.gpus, timeout, on_grant=partial(self._granted, m.tenant_id))
            )
            for m in self.members
        ]
        try:
            await asyncio.wait(asks)
        except BaseException:  # cancelled: nothing of a turn not made stays behind
            if self.turn is None:
                await self._give_up(asks)
            raise
        if self.turn is not None:
            return self.turn
        failed = [(m, e) for m, a in zip(self.members, asks, strict=True) if (e := a.exception())]
        got = {
            m.tenant_id: a.result()
            for m, a in zip(self.members, asks, strict=True)
            if not a.exception()
        }
        if failed or self.epoch < turns.epoch:  # a newer leader took over while room was made
            self._give_back({tenant_id: granted.lease for tenant_id, granted in got.items()})
            if not failed:
                turns.fence(self.epoch)  # raises StaleEpoch, naming both epochs
            member, error = failed[0]
            raise PrepareFailed(f"pod {member.tenant_id} on node {turns.node}: {error}")
        self.granted = {tenant_id: granted.lease for tenant_id, granted in got.items()}
        try:
            return self._make()
        except OSError as exc:  # the turns file: the members' turns go back
            self._give_back(self.granted)
            raise PrepareFailed(f"node {turns.node} could not record the turn: {exc}") from exc

    async def _after_forgets(self) -> None:
        """Wait until the residency layer has forgotten what it kept of each member's departed
        namesake (its process whose last session ended, a pod of its name that left), as a
        registration does (`forgotten`): the turn is planned and told "restored" from what is
        left, not from that namesake's residency, and its grants are not dropped with it. A
        member whose pod left meanwhile fails the preparation; one recreated is taken as it is
        now. No wait (nor step) where none is being forgotten."""
        turns = self._turns
        for member in self.members:
            await turns.service.forgotten(member.tenant_id)
        now = []
        for member in self.members:
            tenant = turns.tenant(member.tenant_id)
            if tenant is None:
                raise PrepareFailed(
                    f"pod {member.tenant_id} left node {turns.node} while its job's turn was "
                    "being prepared"
                )
            now.append(tenant)
        own_gpus(now, self.namespace, self.job, turns.node)
        self.members = now

    def _granted(self, tenant_id: str, lease: Lease) -> None:
        """A member's grant, as it is journaled: the last one makes the turn, in its step."""
        self.granted[tenant_id] = lease
        if (
            self.turn is not None
            or len(self.granted) < len(self.members)
            or self.epoch < self._turns.epoch  # left to `run`, which refuses it
            or self.task.cancelling()  # being given up: not made now
        ):
            return
        try:
            self._make()
        except OSError as exc:  # made again as the acquires end, and refused if it fails again
            log.debug("job turn %s not recorded at its last grant: %s", self.turn_id, exc)

    def _make(self) -> NodeTurn:
        leases = [self.granted[m.tenant_id] for m in self.members]
        turn = NodeTurn(
            turn_id=self.turn_id,
            namespace=self.namespace,
            job=self.job,
            epoch=self.epoch,
            members=tuple(m.tenant_id for m in self.members),
            leases=tuple(lease.lease_id for lease in leases),
            gpus=tuple(sorted({g for lease in leases for g in lease.gpus})),
            tokens=tuple(min(lease.tokens.values()) for lease in leases),
            prepared_at=max(lease.granted_at for lease in leases),
            group=self.group,
            restored=self._restored,
            nodes=self.nodes,
            sessions=self._sessions,
        )
        self._follow_revoked(turn)
        self._turns.add(turn)
        self.turn = turn
        for tell in self.listeners:
            try:
                tell(turn)
            except Exception:  # a listener's defect: not the grant's, which made the turn
                log.exception("job turn %s: telling of it failed", self.turn_id)
        return turn

    def _follow_revoked(self, turn: NodeTurn) -> None:
        """A member the node revoked since its grant (its maximum hold, a higher tier, while the
        others waited) is in the turn under the turn that gives it its GPUs back, as a member
        revoked once the turn is made is (`JobTurns._resumed`)."""
        table, resumes = self._turns.service.table, self._turns.service.turns.resumes
        for member, lease_id in zip(turn.members, turn.leases, strict=True):
            back = None if lease_id in table.leases else resumes.following(member, lease_id, table)
            if back is None:
                continue
            resume = back.waiter_id if isinstance(back, Waiter) else back.lease_id
            turn.follow(member, lease_id, resume)
            log.info(
                "job %s/%s: turn %s: pod %s's lease %s was revoked before the turn was made; "
                "%s gives it back",
                turn.namespace, turn.job, turn.turn_id, member, lease_id, resume,
            )  # fmt: skip

    async def _give_up(self, asks: Sequence[asyncio.Future[Granted]]) -> None:
        for ask in asks:
            ask.cancel()  # a waiting member leaves the queue
        # A second cancel (the call's, then its release's) must not cut this short: the
        # members granted already would keep their GPUs.
        await to_the_end(*asks)
        # A member granted as its acquire was cancelled (the agent stopping in that step) keeps
        # its lease there: `granted` has it. No turn was made or answered, so nobody else does.
        self._give_back(
            {
                m.tenant_id: ask.result().lease
                for m, ask in zip(self.members, asks, strict=True)
                if not ask.cancelled() and ask.exception() is None
            }
            | self.granted
        )

    def _give_back(self, granted: dict[str, Lease]) -> None:
        """The members' turns granted go back, and the turn's stand-in sessions close."""
        for tenant_id, lease in granted.items():
            self._turns.yield_member(tenant_id, lease.lease_id)
        for session in self._sessions:
            self._turns.service.sessions.close(session)
