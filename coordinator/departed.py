"""Jobs gone from the cluster leave the coordinator's table. Pure but for the view's lock.

The table keeps, per tenant (a job's turn on a group), its usage, when it was last served on
each GPU and its fair virtual time (carried in the Lease, `coordinator.fairstate`). Jobs come and
go for months, each name seen once: a tenant whose job has no pod left in the cluster and that
neither holds nor waits for a turn leaves the table, as a pod leaves its node agent's
(`LeaseTable.drop_tenant`: a debt it left with is still remembered, `FairShare.left`).
"""

from __future__ import annotations

from collections.abc import Collection

from agent.core.leases import LeaseTable
from coordinator.cluster import ClusterView


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
    gone = sorted(key for key in known if _job_of(key) not in jobs)
    for key in gone:
        table.drop_tenant(key)
    return gone


def _job_of(key: str) -> tuple[str, str]:
    """(namespace, job) of the arbiter's tenant `namespace/job[@group]` (`turn_key`)."""
    namespace, _, rest = key.partition("/")
    return namespace, rest.partition("@")[0]
