"""A job's member pod asking for its turn itself: its acquire joins its job's cluster-wide turn
through the coordinator (`baton.coordinator.v1.Jobs`), its yield leaves it.

The agent vouches for the pod (found by SO_PEERCRED, like every caller) with the coordination
token. The job's turn starts when the first member asks (every member node makes room and
grants it, `agent.server.jobturns`) and ends when every member that joined it has yielded;
meanwhile a member that asks again joins at once. A coordinator that is away (a new leader
being elected) is asked again until the acquire's own timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time

import grpc

from agent.core.errors import AcquireTimeout, AgentError, Forbidden
from agent.core.leases import Lease
from agent.node.tenants import POD, Tenant
from agent.server.jobturns import JobTurns
from agent.server.node_turn import NodeTurn
from baton._pb import jobturns_pb2 as jt
from baton._pb import jobturns_pb2_grpc as jt_grpc
from baton.contract.coordination import token_metadata
from baton.contract.names import job_of_labels

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.2
RETRY_MAX_S = 2.0
LEAVE_TIMEOUT_S = 10.0
UNAVAILABLE_S = 60.0
"""How long a coordinator may go on answering UNAVAILABLE (or not at all) before an acquire
with no deadline gives up: a failover takes the Lease's duration (15 s by default) and a retry
period, then the new leader's recovery (its watches' first lists, each agent's report of its
turns), so this leaves room for all of them twice over."""


class JobTurnRefused(AgentError):
    """The coordinator did not grant the job's turn; the message says why (FAILED_PRECONDITION)."""


class CoordinatedTurns:
    """Member pods' own acquires and yields, forwarded to the coordinator at `address`."""

    def __init__(self, turns: JobTurns, address: str, token: str) -> None:
        self._turns = turns
        self.address = address
        self._metadata = token_metadata(token)
        self._channel: grpc.aio.Channel | None = None
        self._leaving: set[asyncio.Task[None]] = set()
        self._closing = asyncio.Event()

    def start(self) -> None:
        """Send the leaves the agent before this one could not (kept on disk as `leaving`)."""
        for turn in self._turns.turns.values():
            for pod in turn.leaving:
                self._send_leave(turn, leave_request(turn, pod))

    def _stub(self) -> jt_grpc.JobsStub:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.address)
        return jt_grpc.JobsStub(self._channel)

    def job_of(self, tenant: Tenant, asked: str) -> str:
        """The job whose turn this acquire takes ("": a node-local turn); Forbidden if the pod
        asks for a job it is not a pod of."""
        job = job_of_labels(tenant.labels) if tenant.source == POD else ""
        if asked and asked != job:
            mine = f" (its job is {job!r})" if job else " (it carries no job label)"
            raise Forbidden(f"pod {tenant.tenant_id} is not a pod of job {asked!r}{mine}")
        return job

    async def join(self, tenant: Tenant, job: str, timeout: float | None) -> Lease:
        """The member's lease in its job's turn, once the coordinator has granted it. An acquire
        that fails (or is given up) after the coordinator let the pod join leaves the turn
        again: the pod never computes in it, so it must not keep the turn from ending."""
        answered: list[jt.JoinResponse] = []
        try:
            return await self._join(tenant, job, timeout, answered)
        except BaseException:
            if answered:
                self._unjoin(tenant, job, answered[-1])
            else:  # a Join may have been heard, its answer lost: the join it made is unknown
                for turn in self._turns.turns.values():
                    if tenant.tenant_id in turn.joined:  # (its leave then names none: taken)
                        self._turns.mark_joined(turn, tenant.tenant_id, True, "")
            raise

    def _unjoin(self, tenant: Tenant, job: str, answer: jt.JoinResponse) -> None:
        if any(tenant.tenant_id in turn.joined for turn in self._turns.turns.values()):
            return  # it joined the turn before (its lease revoked since): it is still in it
        namespace = tenant.tenant_id.split("/", 1)[0]
        request = jt.LeaveRequest(
            namespace=namespace,
            job=job,
            pod=tenant.tenant_id,
            turn_id=answer.turn_id,
            join_id=answer.join_id,
        )
        self._send_leave(None, request)

    async def _join(
        self, tenant: Tenant, job: str, timeout: float | None, answered: list[jt.JoinResponse]
    ) -> Lease:
        namespace = tenant.tenant_id.split("/", 1)[0]
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = RETRY_FIRST_S
        away_since: float | None = None
        request = jt.JoinRequest(namespace=namespace, job=job, pod=tenant.tenant_id)
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            request.timeout_s = left or 0.0
            try:
                answer = await self._stub().Join(request, metadata=self._metadata, timeout=left)
            except grpc.aio.AioRpcError as err:
                why = err.details() or err.code().name
                if not why.startswith(f"job {namespace}/{job}"):  # the coordinator named it
                    why = f"job {namespace}/{job}: {why}"
                if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise AcquireTimeout(why) from None
                where = f"the coordinator at {self.address}"
                if err.code() != grpc.StatusCode.UNAVAILABLE:  # only an election is waited out
                    raise JobTurnRefused(f"{where}: {why}") from None
                if deadline is not None and time.monotonic() + wait > deadline:
                    raise AcquireTimeout(f"{where}: {why}") from None
                # The coordinator is away from its first UNAVAILABLE on (a call that waited
                # in the queue before it failed was served meanwhile).
                away_since = time.monotonic() if away_since is None else away_since
                if time.monotonic() + wait - away_since > UNAVAILABLE_S:
                    away = f"unavailable for over {UNAVAILABLE_S:.3g} s"
                    raise JobTurnRefused(f"{where} has been {away}: {why}") from None
                log.info("%s; asking the coordinator again in %.1f s", why, wait)
                await asyncio.sleep(wait)  # a new leader is being elected: back off
                wait = min(wait * 2, RETRY_MAX_S)
                continue
            away_since = None
            answered.append(answer)
            # The turn was prepared on every node before the coordinator answered: it is here.
            lease = self._lease_in(tenant, answer)
            if lease is not None:
                return lease
            # It ended meanwhile (or this pod joined the job late), or the node revoked the pod's
            # lease in it (its maximum hold) and has not given it back yet: that is waited for
            # here, woken as it is given back (or given up), the turn asked about again at the
            # latest after RETRY_MAX_S.
            left = math.inf if deadline is None else deadline - time.monotonic()
            within = min(left, RETRY_MAX_S)
            back = await self._turns.given_back(tenant.tenant_id, answer.turn_id, within)
            if (lease := self._lease_in(tenant, answer)) is not None:
                return lease
            if back and within < left:  # not given back yet: is the turn still held?
                continue
            if back or (deadline is not None and time.monotonic() + wait > deadline):
                raise self._not_joined(tenant, f"job {namespace}/{job}", answer.turn_id, back)
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETRY_MAX_S)

    def _lease_in(self, tenant: Tenant, answer: jt.JoinResponse) -> Lease | None:
        """The member's live lease in the turn the coordinator let it join (it joins it here
        so), or None. A member still in the turn here (its lease revoked) keeps the answer's
        join all the same: the coordinator knows it by that one now."""
        found = self._turns.lease_of(tenant.tenant_id, answer.turn_id)
        lease = self._turns.lease(found[1]) if found is not None else None
        turn = self._turns.turns.get(answer.turn_id)
        if turn is not None and (lease is not None or tenant.tenant_id in turn.joined):
            self._turns.mark_joined(turn, tenant.tenant_id, True, answer.join_id)
        return lease

    def _not_joined(self, tenant: Tenant, job: str, turn_id: str, back: str) -> AgentError:
        """Why the member is not in its job's turn `turn_id` on this node by its deadline."""
        node, pod = self._turns.node, tenant.tenant_id
        if back:
            return AcquireTimeout(
                f"{job}: its turn {turn_id} holds, but node {node} revoked pod {pod}'s lease in "
                f"it and had not given its GPUs back by the deadline: {back}"
            )
        return JobTurnRefused(
            f"{job}: its turn {turn_id} ended on node {node} before pod {pod} could compute in it"
        )

    def holds(self, tenant: Tenant, lease_id: str) -> bool:
        """Whether `lease_id` is the member's lease in a job turn it joined."""
        turn = self._turns.turn_of_lease(tenant.tenant_id, lease_id)
        return turn is not None and tenant.tenant_id in turn.joined

    def leave(self, tenant: Tenant, lease_id: str) -> float:
        """The member yields: it leaves its job's turn (the coordinator ends the turn when the
        last one leaves). Returns how long the member held it."""
        turn = self._turns.turn_of_lease(tenant.tenant_id, lease_id)
        if turn is None:
            return 0.0
        self._turns.mark_joined(turn, tenant.tenant_id, False)
        self._send_leave(turn, leave_request(turn, tenant.tenant_id))
        lease = self._turns.lease(turn.lease_of(tenant.tenant_id))
        now = self._turns.service.state.clock()  # the clock the lease was granted on
        return max(0.0, now - lease.granted_at) if lease is not None else 0.0

    def session_ended(self, tenant_id: str) -> None:
        """A member's process went away: with no session of its own left, it leaves any turn it
        had joined (the stand-in session the agent keeps for the turn does not count)."""
        if self._turns.has_own_session(tenant_id):
            return
        for turn in list(self._turns.turns.values()):
            if tenant_id in turn.joined:
                tenant = self._turns.tenant(tenant_id)
                if tenant is not None:
                    self.leave(tenant, turn.lease_of(tenant_id))

    def _send_leave(self, turn: NodeTurn | None, request: jt.LeaveRequest) -> None:
        task = asyncio.get_running_loop().create_task(self._leave(turn, request))
        self._leaving.add(task)
        task.add_done_callback(self._leaving.discard)

    async def _leave(self, turn: NodeTurn | None, request: jt.LeaveRequest) -> None:
        """Tell the coordinator; one that is away (an election) is told again, with backoff, for
        at most UNAVAILABLE_S, while the member has not joined the turn again: until it hears,
        the member is reported to a new leader as still in the turn, so the turn ends there."""
        wait, away_since = RETRY_FIRST_S, time.monotonic()
        unsent = False
        try:
            while True:
                try:
                    await self._stub().Leave(
                        request, metadata=self._metadata, timeout=LEAVE_TIMEOUT_S
                    )
                    return
                except grpc.aio.AioRpcError as err:
                    why = err.details() or err.code().name
                    retry = err.code() == grpc.StatusCode.UNAVAILABLE
                    if retry and self._closing.is_set():
                        if turn is None:  # an unjoin: nothing on disk to send it again
                            log.warning("pod %s's leave is not sent: %s", request.pod, why)
                            return
                        unsent = True  # kept on disk: the next agent sends it (`start`)
                        log.info("pod %s's leave is sent by the next agent: %s", request.pod, why)
                        return
                    if not retry or time.monotonic() + wait - away_since > UNAVAILABLE_S:
                        log.warning(  # its turn ends with its agent's maximum hold
                            "pod %s left job %s/%s's turn, but the coordinator did not hear "
                            "it: %s", request.pod, request.namespace, request.job, why,
                        )  # fmt: skip
                        return
                with contextlib.suppress(TimeoutError):  # an agent stopping tells no more
                    await asyncio.wait_for(self._closing.wait(), wait)
                wait = min(wait * 2, RETRY_MAX_S)
                if turn is not None and (
                    request.pod not in turn.leaving or turn.turn_id not in self._turns.turns
                ):
                    return  # it joined again meanwhile, or the turn ended here
        finally:
            if turn is not None and not unsent:
                self._turns.left_heard(turn, request.pod)

    async def close(self) -> None:
        """Let the leaves in flight finish (each bounded, none sent again: one the coordinator
        did not hear stays on disk for the next agent's `start`), then close the channel."""
        self._closing.set()
        await asyncio.gather(*self._leaving, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()


def leave_request(turn: NodeTurn, pod: str) -> jt.LeaveRequest:
    """The member's leave of `turn`, naming the turn and its join of it (the coordinator ignores
    a leave that reaches it after the member joined again)."""
    return jt.LeaveRequest(
        namespace=turn.namespace,
        job=turn.job,
        group=turn.group,
        pod=pod,
        turn_id=turn.turn_id,
        join_id=turn.joins.get(pod, ""),
    )
