"""Node agents on loopback for the coordinator's tests: each a real lease service with its job
turns served over gRPC on 127.0.0.1, and the cluster view the coordinator's watches would build.

The agents here run in the test's event loop (no parking backend); `tests/coordinator/
test_cluster.py` runs whole agent processes against a real API server instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from agent.core.leases import LeaseTable
from agent.core.residency import NullPreparer
from agent.node.jobturn_store import JobTurnStore
from agent.node.state import StateStore
from agent.node.tenants import POD, Tenant
from agent.server.jobturns import JobTurns
from agent.server.jobturns_link import JobTurnServer
from agent.server.service import LeaseService
from baton.contract.names import LABEL_JOB, LABEL_LLMD_GROUP
from coordinator.agents import AgentLinks
from coordinator.cluster import ClusterView, Member, Node
from coordinator.recovery import recover
from coordinator.turns import Arbiter

TOKEN = "loopback-token"


class LoopbackNode:
    """One node's agent: its lease service, job turns and their listener."""

    def __init__(
        self,
        name: str,
        state_dir: Path,
        gpus: tuple[str, ...],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.gpus = gpus
        self.state_dir = state_dir
        self.clock = clock
        """The agent's clock (another machine's may disagree with the coordinator's)."""
        self._load()
        self.address = ""

    def _load(self) -> None:
        """The lease service and job turns, from what the state directory keeps."""
        self.service = LeaseService(
            table=LeaseTable(clock=self.clock),
            preparer=lambda host: NullPreparer(),
            clock=self.clock,
            store=StateStore(self.state_dir),
        )
        self.service.load()
        self.turns = JobTurns(self.service, self.name, JobTurnStore(self.state_dir), self.clock)
        self.turns.load()
        self.server = JobTurnServer(self.turns, "127.0.0.1:0", TOKEN)

    async def start(self) -> LoopbackNode:
        port = await self.server.start()
        self.address = f"127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        await self.server.stop(0)
        await self.service.close()

    async def restart(self, pods: dict[str, str]) -> None:
        """The whole agent stops and starts again from its state directory, on the same address,
        with `pods` (pod → job) on its GPUs."""
        await self.stop()
        self._load()
        for name, job in pods.items():
            self.add_pod(name, self.gpus, job)
        await self.restart_server()

    async def restart_server(self) -> None:
        """Serve the job turns again on the same address (an agent back after a restart)."""
        self.server = JobTurnServer(self.turns, self.address, TOKEN)
        await self.server.start()

    def add_pod(self, pod: str, gpus: tuple[str, ...], job: str = "", group: str = "") -> Tenant:
        labels = {LABEL_JOB: job} if job else {}
        if group:
            labels[LABEL_LLMD_GROUP] = group
        tenant = Tenant(pod, pod.split("/")[1], gpus, source=POD, labels=labels)
        self.service.upsert_pod(tenant)
        return tenant

    def holders(self) -> dict[str, str]:
        """GPU → the tenant holding it now."""
        return {
            gpu: lease.tenant_id
            for lease in self.service.table.leases.values()
            for gpu in lease.gpus
        }


def view_of(nodes: list[LoopbackNode], jobs: dict[str, list[tuple[str, str, str]]]) -> ClusterView:
    """The view of `nodes` with `jobs`: job → [(pod, node, group)], every pod on its node's GPUs
    as the node's `add_pod` gave them."""
    view = ClusterView()
    by_name = {n.name: n for n in nodes}
    for node in nodes:
        view.nodes[node.name] = Node(node.name, node.address, node.gpus)
    for job, pods in jobs.items():
        for pod, node_name, group in pods:
            node = by_name[node_name]
            tenant = node.add_pod(pod, node.gpus, job, group)
            namespace = pod.split("/")[0]
            view.members[pod] = (namespace, job, Member(pod, node_name, tenant.gpus, group))
    return view


async def leading(view: ClusterView, epoch: int = 1, holder: str = "") -> Arbiter:
    """An arbiter over `view` that leads with `epoch` (as `holder`), having recovered the
    agents' turns."""
    links = AgentLinks(TOKEN, holder=holder)
    arbiter = Arbiter(view, links, lambda: LeaseTable(clock=time.time), time.time)
    table = arbiter.new_table()
    found = await recover(view, arbiter.links, table, epoch)
    arbiter.lead(epoch, table, found)
    return arbiter
