"""Jobs gone from the cluster leave the coordinator's table. Pure but for the view's lock and
the connections to gone nodes' agents, which close.

The table keeps, per tenant (a job's turn on a group), its usage, when it was last served on
each GPU and its fair virtual time (carried in the Lease, `coordinator.fairstate`). Jobs come and
go for months, each name seen once: a tenant whose job has no pod left in the cluster and that
neither holds nor waits for a turn leaves the table, as a pod leaves its node agent's
(`LeaseTable.drop_tenant`: a debt it left with is still remembered, `FairShare.left`).

Nodes come and go all day too (a cluster autoscaler, spot nodes), each name seen once: the state
kept per GPU (`node/GPU`: its entry in the table, when its turn last changed, its fair clocks,
carried in the Lease too) of a node deleted from the cluster is forgotten once no turn holds or
waits for it, and the connection to its agent closes (`forget_gone_nodes`).
"""

from __future__ import annotations

from collections.abc import Collection, MutableMapping
from typing import TYPE_CHECKING

from agent.core.fair import clock_gpu
from agent.core.leases import GpuState, LeaseTable
from coordinator.agents import AgentLinks
from coordinator.cluster import ClusterView
from coordinator.jobturn import parse_turn_key

if TYPE_CHECKING:
    from coordinator.turns import Arbiter

_FREE = GpuState()
"""The state of a GPU the table does not know: held by nobody (read only)."""


def forget_departed(arbiter: Arbiter, busy: Collection[str]) -> None:
    """The jobs and nodes gone from the cluster that the arbiter holds and waits for nothing of
    (`busy`: the tenants it holds or asks a turn for) leave its table (`forget_gone`,
    `forget_gone_nodes`); then its `on_pruned` hears."""
    forget_gone(arbiter.table, arbiter.view, busy)
    heard = arbiter.settling.heard
    forget_gone_nodes(arbiter.table, arbiter.view, arbiter.changed_at, heard, arbiter.links)
    arbiter.on_pruned()


def forget_gone(table: LeaseTable, view: ClusterView, busy: Collection[str]) -> list[str]:
    """Drop from `table` the tenants of jobs with no pod in `view` that hold and wait for
    nothing (`busy`: tenants the arbiter holds or asks a turn for); the tenants dropped."""
    with view.lock:
        jobs = {(namespace, job) for namespace, job, _ in view.members.values()}
    known = set(table.usage)
    for state in table.gpus.values():
        known.update(state.served)
    if table.fair is not None:  # (clocks a previous leader left in the Lease, too)
        known.update(table.fair.vtime.keys() - table.fair.departed.keys())
    known.difference_update(busy)
    known.difference_update(lease.tenant_id for lease in table.leases.values())
    known.difference_update(waiter.tenant_id for waiter in table.waiters.values())
    gone = sorted(key for key in known if parse_turn_key(key)[:2] not in jobs)
    for key in gone:
        table.drop_tenant(key)
    return gone


def forget_gone_nodes(
    table: LeaseTable,
    view: ClusterView,
    changed_at: MutableMapping[str, float],
    heard: set[str],
    links: AgentLinks | None = None,
) -> list[str]:
    """Drop from `table` (and `changed_at`) the GPUs (`node/GPU`) of nodes gone from `view`
    that no turn holds or waits for, and from `heard` (`Settling.heard`) the nodes gone (one
    that comes back is asked again); close `links`' connections to addresses no node in `view`
    names (an agent still up on a deleted node's machine keeps one open); the GPUs dropped."""
    with view.lock:
        nodes = set(view.nodes)
        addresses = {node.address for node in view.nodes.values() if node.address}
    heard.intersection_update(nodes)
    if links is not None:
        links.forget_others(addresses)
    named = {gpu for lease in table.leases.values() for gpu in lease.gpus}
    named.update(gpu for waiter in table.waiters.values() for gpu in waiter.gpus)
    known = set(table.gpus) | set(changed_at)
    fair = table.fair
    if fair is not None:
        known.update(clock_gpu(key) for key in fair.vclock)
        known.update(gpu for gpu, _ in fair.balance)
    gone = sorted(
        gpu
        for gpu in known - named
        if gpu.partition("/")[0] not in nodes and table.gpus.get(gpu, _FREE).holder is None
    )
    if not gone:
        return gone
    dropped = set(gone)
    for gpu in gone:
        table.gpus.pop(gpu, None)
        changed_at.pop(gpu, None)
    if fair is not None:
        for clock in [k for k in fair.vclock if clock_gpu(k) in dropped]:
            del fair.vclock[clock]
        for owed in [k for k in fair.balance if k[0] in dropped]:
            del fair.balance[owed]
    return gone
