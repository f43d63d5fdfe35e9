"""llm-d jobs as Baton tenants: which tenant a job is, which processes are it, and when they end.

A job is the tenant `llmd/<job id>` on the GPUs of every group it joined, declared to need
those GPUs whole (llm-d's API carries no memory size). Each process that calls for a job (found from
its TCP connection, `agent.node.peers`) counts as one of the job's sessions; when the last one
exits, the job's turns and waits end, as for any tenant whose session closes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path

from agent.core.errors import Forbidden, InvalidRegistration
from agent.node.peers import PeerProcess, ProcessWatch, peer_process
from agent.node.tenants import LLMD, Tenant
from agent.server.llmd.edge import UnknownGroup, UnknownJob
from agent.server.llmd.groups import Groups, valid_id
from agent.server.service import LeaseService
from agent.server.sessions import Session
from baton._pb import agent_pb2 as pb
from baton.names import MIB

log = logging.getLogger(__name__)

PREFIX = f"{LLMD}/"


class ProcessSession(Session):
    """A job's process standing in for a session: it lives as long as the process does."""

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
    ) -> None:
        self.service = service
        self.groups = groups
        self._gpu_memory = dict(gpu_memory)
        self._port = server_port
        self._proc_root = proc_root
        self._watch = ProcessWatch(asyncio.get_running_loop())
        self._callers: dict[str, PeerProcess | None] = {}
        """gRPC peer (one per client connection) → its process, once looked up."""
        self._sessions: dict[tuple[str, int], Session] = {}

    def close(self) -> None:
        """Stop watching processes (the agent is stopping; turns are kept for the next one)."""
        self._watch.close()

    # Who.

    async def caller(self, peer: str) -> PeerProcess | None:
        """The local process behind a gRPC peer, or None if it is outside our network namespace."""
        if peer not in self._callers:
            found = await asyncio.to_thread(peer_process, peer, self._port, self._proc_root)
            self._callers[peer] = found
        return self._callers[peer]

    def tenant_id(self, job_id: str) -> str:
        """The tenant a job is."""
        return PREFIX + job_id

    def job_of(self, tenant_id: str) -> str:
        """The llm-d job id of a tenant (other tenants go by their tenant id)."""
        return tenant_id[len(PREFIX) :] if tenant_id.startswith(PREFIX) else tenant_id

    def find(self, job_id: str, group: str = "") -> Tenant | None:
        """The job's tenant, if the agent has it."""
        return self.service.tenants.tenants.get(self.tenant_id(job_id))

    def job_ids(self) -> dict[str, Tenant]:
        """Every llm-d job the agent has, by job id."""
        return {
            self.job_of(tid): tenant
            for tid, tenant in self.service.tenants.tenants.items()
            if tid.startswith(PREFIX)
        }

    def group_gpus(self, group: str) -> tuple[str, ...]:
        """The group's GPUs, or `UnknownGroup`."""
        gpus = self.groups.gpus(group)
        if gpus is None:
            known = ", ".join(self.groups.names()) or "none"
            raise UnknownGroup(f"no group {group!r} on this node (groups: {known})")
        return gpus

    # Joining.

    async def join(self, job_id: str, group: str, peer: str) -> Tenant:
        """The job's tenant, on `group`'s GPUs; the calling process becomes one of its sessions."""
        if not valid_id(job_id):
            raise InvalidRegistration("job_id must be 1-253 printable characters without spaces")
        gpus = self.group_gpus(group)
        caller = await self.caller(peer)
        tenant = self.find(job_id, group)
        self.check_caller(tenant, caller)
        if tenant is None or (tenant.source == LLMD and not set(gpus) <= set(tenant.gpus)):
            tenant = self._job_tenant(job_id, gpus, tenant, caller)
            self.service.upsert_tenant(tenant, "llm-d job")
        if caller is not None:
            tenant.pids.add(caller.pid)
        self._anchor(tenant.tenant_id, caller.pid if caller else 0)
        return tenant

    async def check(self, job_id: str, group: str, peer: str) -> Tenant:
        """The job's tenant for a call that needs it to exist, checked against the caller."""
        self.group_gpus(group)
        tenant = self.find(job_id, group)
        if tenant is None:
            raise UnknownJob(f"no job {job_id!r} in group {group!r} on this node")
        self.check_caller(tenant, await self.caller(peer))
        return tenant

    def check_caller(self, tenant: Tenant | None, caller: PeerProcess | None) -> None:
        """A job belongs to the user whose process first used it (root may act for any)."""
        if tenant is None or tenant.uid is None or caller is None or caller.uid in (0, tenant.uid):
            return
        raise Forbidden(
            f"job {self.job_of(tenant.tenant_id)!r} belongs to UID {tenant.uid}, not {caller.uid}"
        )

    def _job_tenant(
        self,
        job_id: str,
        gpus: tuple[str, ...],
        old: Tenant | None,
        caller: PeerProcess | None,
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
        self._callers = {k: v for k, v in self._callers.items() if v is None or v.pid != pid}
        session = self._sessions.pop((tenant_id, pid), None)
        if session is None:
            return
        log.info("llm-d job %s: process %d exited", self.job_of(tenant_id), pid)
        last = self.service.sessions.close(session)
        self.service.session_closed(tenant_id, pid, last)
        if last:
            self._sessions.pop((tenant_id, 0), None)
