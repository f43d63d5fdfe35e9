"""The line a restarted agent logs of what it restored: counts named in the singular for one."""

from __future__ import annotations

import pytest

from agent.core.leases import Lease
from agent.node.state import PersistedState
from agent.node.state_json import SavedResume
from agent.node.tenants import Tenant
from agent.server.tenancy import restored_line


def saved(tenants: int, leases: int, resumes: int, replayed: int) -> PersistedState:
    return PersistedState(
        tenants=[Tenant(f"local/t{i}", f"t{i}", ("GPU-0",)) for i in range(tenants)],
        leases=[
            Lease(f"l{i}", "local/t0", ("GPU-0",), {"GPU-0": i}, 0.0, 1.0) for i in range(leases)
        ],
        resumes={f"w{i}": SavedResume(f"w{i}", "local/t0", ("GPU-0",)) for i in range(resumes)},
        replayed=replayed,
    )


@pytest.mark.parametrize(
    ("counts", "line"),
    [
        (
            (1, 1, 1, 1),
            "restored 1 tenant and 1 lease, and 1 revoked turn to give back (1 entry after the "
            "snapshot, from the journal); each tenant has 10 s to reconnect",
        ),
        (
            (3, 2, 2, 5),
            "restored 3 tenants and 2 leases, and 2 revoked turns to give back (5 entries after "
            "the snapshot, from the journal); each tenant has 10 s to reconnect",
        ),
        (
            (2, 0, 0, 0),
            "restored 2 tenants and 0 leases (0 entries after the snapshot, from the journal); "
            "each tenant has 10 s to reconnect",
        ),
    ],
)
def test_the_restored_line_counts_in_the_singular_for_one(
    counts: tuple[int, int, int, int], line: str
) -> None:
    assert restored_line(saved(*counts), 10.0) == line
