"""llm-d jobs as Baton tenants: which tenant a job is, which processes are it, and when they end.

A job outside Kubernetes is the tenant `llmd/<job id>` on the GPUs of every group it joined,
declared to need those GPUs whole (llm-d's API carries no memory size). In a cluster it is the
pod labelled `timeslice.io/job-id`, and a group is the GPUs of the pods labelled with it
(`timeslice.io/group`); only the pod's own processes may act for its job. Each process that
calls for a job (found from its TCP connection, `agent.node.peers`) counts as one of the job's
sessions; when the last one exits, the job's turns and waits end, as for any tenant whose
session closes. A caller whose process cannot be found (another host) cannot be watched: a job
only such callers use leaves once no call has named it for `idle_after` seconds while it has no
turn, no wait and no memory parked, moving or (but by the `app` method) on a GPU.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

from agent.core.errors import Forbidden, InvalidRegistration
from agent.node.identity import pod_uid_of_pid
from agent.node.peers import Callers, PeerProcess, ProcessWatch, listener_process
from agent.node.tenants import LLMD, POD, Tenant
from agent.parking.methods import APP
from agent.server.llmd.edge import UnknownGroup, UnknownJob
from agent.server.llmd.groups import Groups, pod_groups, pod_membership, valid_id
from agent.server.service import LeaseService
from agent.server.sessions import Session
from baton._pb import agent_pb2 as pb
from baton.contract.names import DEPARTED, LABEL_LLMD_JOB, MIB

log = logging.getLogger(__name__)

PREFIX = f"{LLMD}/"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class ProcessSession(Session):
    """A job's process standing in for a session: it lives as long as the process does."""

    names_revoked = False  # llm-d's API has no revoked lease to name

    def send(self, message: pb.AgentMessage) -> None:
        """Nothing reads pushes here; llm-d's API has no way to deliver them."""


class Jobs:
    """The llm-d jobs this agent knows, over the lease service's tenants."""

    def __init__(
        self,
        service: LeaseService,
        groups: Groups,
        gpu_memory: Mapping[str, int],
        server_port: int,
        proc_root: Path = Path("/proc"),
        idle_after: float = 0.0,
    ) -> None:
        self.service = service
        self.groups = groups
        self._gpu_memory = dict(gpu_memory)
        self._port = server_port
        self._proc_root = proc_root
        self._watch = ProcessWatch(asyncio.get_running_loop())
        self._callers = Callers(self._watch, server_port, proc_root)
        self._sessions: dict[tuple[str, int], Session] = {}
        self._idle_after = idle_after
        """Seconds unseen before a job only unwatched callers use leaves (0 = never)."""
        self._idle: dict[str, asyncio.TimerHandle] = {}
        self.call_later: Callable[..., asyncio.TimerHandle] = asyncio.get_running_loop().call_later
        """Sets the idle timers (a test's fake clock may stand in)."""

    def close(self) -> None:
        """Stop watching processes (the agent is stopping; turns are kept for the next one)."""
        self._watch.close()
        for timer in self._idle.values():
            timer.cancel()
        self._idle.clear()

    # Who.

    async def caller(self, peer: str) -> PeerProcess | None:
        """The local process behind a gRPC peer, or None if it is outside our network namespace."""
        return await self._callers.of(peer)

    async def seen_by(self, peer: str) -> Callable[[str], bool]:
        """Which tenants' job ids (and pod-labelled groups) a caller may see, by tenant id: a
        pod's process, its own namespace's pods' only; a process of this host outside pods,
        every one; a caller not found here (another host), the jobs outside pods."""
        caller = await self.caller(peer)
        return self._seen_by(
            caller, pod_uid_of_pid(caller.pid, self._proc_root) if caller else None
        )

    def _seen_by(self, caller: PeerProcess | None, pod: str | None) -> Callable[[str], bool]:
        """`seen_by` for a caller found (or not) and the pod its process runs in (or None)."""
        tenants = self.service.tenants.tenants
        if caller is not None and not pod:
            return lambda tenant_id: True
        if not pod:
            return lambda tenant_id: tenant_id in tenants and tenants[tenant_id].source != POD
        own = next((t for t in tenants.values() if t.source == POD and t.pod_uid == pod), None)
        mine = f"{own.tenant_id.split('/', 1)[0]}/" if own else None
        return lambda tenant_id: (
            mine is not None
            and tenant_id.startswith(mine)
            and (tenant_id not in tenants or tenants[tenant_id].source == POD)
        )

    def _pods(self) -> list[tuple[Tenant, tuple[str, str]]]:
        """Pod tenants labelled with an llm-d job and group, and those labels."""
        found = []
        for tenant in self.service.tenants.tenants.values():
            member = pod_membership(tenant.labels) if tenant.source == POD else None
            if member is not None:
                found.append((tenant, member))
        return found

    def job_of(self, tenant_id: str) -> str:
        """The llm-d job id of a tenant (its label for a pod; others go by their tenant id)."""
        if tenant_id.startswith(PREFIX):
            return tenant_id[len(PREFIX) :]
        tenant = self.service.tenants.tenants.get(tenant_id)
        member = pod_membership(tenant.labels) if tenant is not None else None
        return member[0] if member else tenant_id

    def find(
        self, job_id: str, group: str = "", caller: PeerProcess | None = None
    ) -> Tenant | None:
        """The job's tenant: the pod labelled with it (in `group`, if given; the caller's own pod
        first, as pods of other namespaces may carry the same job id), else `llmd/<id>`."""
        pods = [t for t, (job, g) in self._pods() if job == job_id and group in ("", g)]
        if len(pods) > 1 and caller is not None:  # (the caller's /proc is read only then)
            own = pod_uid_of_pid(caller.pid, self._proc_root)
            mine = [t for t in pods if own and t.pod_uid == own]
            pods = mine or pods
        if pods:
            return pods[0]
        found = self.service.tenants.tenants.get(PREFIX + job_id)
        if found is not None:  # a call named it: its idle time starts again
            self.seen(found.tenant_id)
        return found

    def job_ids(self, seen: Callable[[str], bool] = lambda tenant_id: True) -> dict[str, Tenant]:
        """Every llm-d job the agent has (`llmd/` tenants and labelled pods) whose tenant `seen`
        accepts, by job id."""
        jobs = {
            self.job_of(tid): tenant
            for tid, tenant in self.service.tenants.tenants.items()
            if tid.startswith(PREFIX) and seen(tid)
        }
        jobs.update({job: t for t, (job, _) in self._pods() if seen(t.tenant_id)})
        return jobs

    def group_names(self, seen: Callable[[str], bool] = lambda tenant_id: True) -> list[str]:
        """Every group: given with `--llmd-group`, or named by the label of a pod `seen` accepts."""
        labelled = {group for t, (_, group) in self._pods() if seen(t.tenant_id)}
        return sorted(set(self.groups.names()) | labelled)

    def group_gpus(self, group: str, seen: Callable[[str], bool]) -> tuple[str, ...]:
        """The group's GPUs, or `UnknownGroup` naming the groups `seen` lets the caller see."""
        gpus = self.groups.gpus(group) or pod_groups(
            (member, tenant.gpus) for tenant, member in self._pods()
        ).get(group)
        if not gpus:
            raise self.unknown_group(group, seen)
        return gpus

    def unknown_group(self, group: str, seen: Callable[[str], bool]) -> UnknownGroup:
        """No group `group` (for this caller), with the groups it may see (`seen_by`)."""
        known = ", ".join(self.group_names(seen)) or "none"
        return UnknownGroup(f"no group {group!r} on this node (groups: {known})")

    def turn_gpus(self, tenant: Tenant, group: str, seen: Callable[[str], bool]) -> tuple[str, ...]:
        """The GPUs of the job's turn in `group`: the group's (a pod's own, within it)."""
        gpus = self.group_gpus(group, seen)
        if tenant.source == POD:
            return tuple(g for g in gpus if g in tenant.gpus)
        return gpus

    # Joining.

    async def join(self, job_id: str, group: str, peer: str) -> Tenant:
        """The job's tenant, on `group`'s GPUs; the calling process becomes one of its sessions."""
        if not valid_id(job_id):
            raise InvalidRegistration("job_id must be 1-253 printable characters without spaces")
        if job_id == DEPARTED:
            raise InvalidRegistration(f"job_id {DEPARTED} names the accounting's departed tenants")
        gpus = self.group_gpus(group, await self.seen_by(peer))
        caller = await self.caller(peer)
        await self.service.forgotten(PREFIX + job_id)  # a job of this id that left goes first
        tenant = self.find(job_id, group, caller)
        self.check_caller(tenant, caller)
        if tenant is None or (tenant.source == LLMD and not set(gpus) <= set(tenant.gpus)):
            tenant = self._job_tenant(job_id, gpus, tenant, caller)
            self.service.upsert_tenant(tenant, "llm-d job")
        self._attach(tenant, caller)
        return tenant

    async def join_known(self, job_id: str, peer: str) -> Tenant:
        """The job's tenant for a caller that names no group (llm-d's `register_workload` sends
        none): the job must be known already; the calling process becomes one of its sessions."""
        caller = await self.caller(peer)
        tenant = self.find(job_id, "", caller)
        if tenant is None:
            known = ", ".join(self.group_names(await self.seen_by(peer))) or "none"
            raise UnknownJob(
                f"no job {job_id!r} on this node: name its group (groups: {known}), "
                "or register after the job has acquired one"
            )
        self.check_caller(tenant, caller)
        self._attach(tenant, caller)
        return tenant

    def _attach(self, tenant: Tenant, caller: PeerProcess | None) -> None:
        if caller is not None and self.service.tenants.add_pids(tenant, [caller.pid]):
            self.service.state.journal_tenant(tenant)
        self._anchor(tenant.tenant_id, caller.pid if caller else 0)
        self.seen(tenant.tenant_id)

    async def check(self, job_id: str, group: str, peer: str) -> Tenant:
        """The job's tenant for a call that needs it to exist, checked against the caller. The
        group may be empty (llm-d's client sends `group=""`): the caller's pod tells apart jobs
        of one id in several namespaces."""
        if group:
            self.group_gpus(group, await self.seen_by(peer))
        caller = await self.caller(peer)
        tenant = self.find(job_id, group, caller)
        if tenant is None:
            where = f" in group {group!r}" if group else ""
            raise UnknownJob(f"no job {job_id!r}{where} on this node")
        self.check_caller(tenant, caller)
        return tenant

    def check_caller(self, tenant: Tenant | None, caller: PeerProcess | None) -> None:
        """A pod's job is only its own processes', and a pod's process acts for no other job;
        another job belongs to the user whose process first used it (root may act for any)."""
        pod = pod_uid_of_pid(caller.pid, self._proc_root) if caller else None
        if tenant is not None and tenant.source == POD:
            if pod != tenant.pod_uid:
                seen = self._seen_by(caller, pod)(tenant.tenant_id)
                whose = f"pod {tenant.tenant_id}" if seen else "a pod of another namespace"
                raise Forbidden(
                    f"job {self.job_of(tenant.tenant_id)!r} is {whose}; "
                    "only its own processes may act for it"
                )
            return
        if caller is not None and pod:  # not even root in its container: other jobs are the host's
            raise Forbidden(
                f"process {caller.pid} runs in pod {pod}: a pod's processes act "
                f"only for their own pod's job (its {LABEL_LLMD_JOB} label)"
            )
        if tenant is None or tenant.uid is None or caller is None or caller.uid in (0, tenant.uid):
            return
        raise Forbidden(
            f"job {self.job_of(tenant.tenant_id)!r} belongs to UID {tenant.uid}, not {caller.uid}"
        )

    def check_pids(self, tenant: Tenant, pids: Iterable[int]) -> None:
        """`Forbidden` unless every PID is the job's own: a process of its pod, or (a job outside
        Kubernetes) one of the processes that called for it. llm-d's API carries no credentials."""
        if tenant.source == POD:
            foreign = [p for p in pids if pod_uid_of_pid(p, self._proc_root) != tenant.pod_uid]
        else:
            foreign = [p for p in pids if p not in tenant.pids]
        if foreign:
            raise Forbidden(
                f"PIDs {', '.join(map(str, sorted(foreign)))} are not processes of job "
                f"{self.job_of(tenant.tenant_id)!r}; a job may only checkpoint its own"
            )

    async def check_endpoints(self, tenant: Tenant, urls: Iterable[str]) -> tuple[str, ...]:
        """The job's engine URLs, each `http://` on this host's loopback and served by a process
        of the job's own (one that called for it, or of its UID); `Forbidden` otherwise."""
        checked = []
        for url in urls:
            parsed = urlsplit(url if "://" in url else f"http://{url}")
            if parsed.scheme != "http" or parsed.hostname not in LOOPBACK or not parsed.port:
                raise Forbidden(
                    f"endpoint {url!r}: Baton calls only http://HOST:PORT on this host's loopback "
                    f"({', '.join(LOOPBACK)}), served by the job's own process"
                )
            owner = await asyncio.to_thread(listener_process, parsed.port, self._proc_root)
            mine = (
                owner is not None
                and tenant.source != POD
                and (
                    owner.pid in tenant.pids or (tenant.uid is not None and owner.uid == tenant.uid)
                )
            )
            if not mine:
                raise Forbidden(
                    f"endpoint {url!r}: port {parsed.port} is not served by a process of job "
                    f"{self.job_of(tenant.tenant_id)!r}"
                )
            checked.append(f"http://{parsed.netloc}{parsed.path}")  # a base path is kept
        return tuple(checked)

    def _job_tenant(
        self, job_id: str, gpus: tuple[str, ...], old: Tenant | None, caller: PeerProcess | None
    ) -> Tenant:
        wanted = tuple(sorted(set(gpus) | set(old.gpus if old else ())))
        whole = max((self._gpu_memory.get(g, 0) for g in wanted), default=0)
        return Tenant(
            tenant_id=PREFIX + job_id,
            name=job_id,
            gpus=wanted,
            gpu_memory_mib=whole // MIB,
            source=LLMD,
            uid=old.uid if old else (caller.uid if caller else None),
            pids=set(old.pids) if old else set(),
        )

    def anchored(self, tenant_id: str, pid: int) -> bool:
        """Whether `pid` (not 0) counts as a session of the tenant: a live process of the job."""
        return bool(pid) and (tenant_id, pid) in self._sessions

    def _anchor(self, tenant_id: str, pid: int) -> None:
        """Count `pid` as a session of the tenant until it exits (0: a caller we cannot watch)."""
        key = (tenant_id, pid)
        if key in self._sessions:
            return
        if pid and not self._watch.watch(pid, lambda p: self._exited(tenant_id, p)):
            return
        session = ProcessSession(tenant_id, pid, token="")
        self._sessions[key] = session
        self.service.sessions.open(session)
        self.service.session_opened(tenant_id, pid)

    def _exited(self, tenant_id: str, pid: int) -> None:
        session = self._sessions.pop((tenant_id, pid), None)
        if session is None:
            return
        log.info("llm-d job %s: process %d exited", self.job_of(tenant_id), pid)
        last = self.service.sessions.close(session)
        self.service.session_closed(tenant_id, pid, last)
        if last:
            self._sessions.pop((tenant_id, 0), None)

    # Callers that cannot be watched.

    def seen(self, tenant_id: str) -> None:
        """A call named the job, its WorkloadChannel closed (it may be reconnecting) or it was
        busy when its time came: it leaves `idle_after` seconds from now if none names it again
        and only unwatched callers (`_anchor(..., 0)`) are left to it then."""
        if self._idle_after <= 0 or (tenant_id, 0) not in self._sessions:
            return
        if (old := self._idle.pop(tenant_id, None)) is not None:
            old.cancel()
        self._idle[tenant_id] = self.call_later(self._idle_after, self._idle_out, tenant_id)

    def _idle_out(self, tenant_id: str) -> None:
        """`idle_after` passed with no call naming the job: it leaves unless it is busy (then
        it is looked at again `idle_after` later)."""
        self._idle.pop(tenant_id, None)
        session = self._sessions.get((tenant_id, 0))
        tenant = self.service.tenants.tenants.get(tenant_id)
        if session is None or tenant is None or tenant.source != LLMD:
            return
        if self._busy(tenant_id):
            self.seen(tenant_id)  # looked at again as long after
            return
        del self._sessions[(tenant_id, 0)]
        self.service.sessions.close(session)
        self.service.left(
            tenant_id,
            f"no llm-d call named it for {self._idle_after:g} s (--llmd-forget-idle-after) and "
            "it had no turn, no wait and no memory on a GPU or parked; its callers cannot be "
            "watched",
        )

    def _busy(self, tenant_id: str) -> bool:
        """Whether the job must stay: a watched process or a WorkloadChannel is open, it holds
        or waits for a turn, or memory of it is on a GPU (forgotten, it would be room the next
        turn counts on; but the `app` method's is its channels' processes', gone with them, as
        an engine's, `endpoint`, or an unseen process's is not), parked or moving."""
        table, parking = self.service.table, self.service.parking
        where = self.service.preparer.residency_of(tenant_id).values()
        app = parking is not None and parking.method_of(tenant_id) == APP
        return (
            any(pid and t == tenant_id for t, pid in self._sessions)
            or self.service.sessions.connected_besides(tenant_id, ProcessSession)
            or bool(table.leases_of(tenant_id))
            or any(w.tenant_id == tenant_id for w in table.waiters.values())
            or any(state != "resident" for state in where)
            or (self.service.preparer.on_gpus(tenant_id) > 0 and not app)
            or (parking is not None and parking.moving(tenant_id))
        )
