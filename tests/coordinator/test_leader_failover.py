"""How soon a standby takes over a dead leader's Lease: within the Lease's duration plus one
retry period of the leader's last renewal (docs/coordinator.md, Failures). The elector's own
steps, as its thread takes them, against a Lease kept in memory and the test's clock."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from coordinator.leader import LeaderElector

DURATION_S, RENEW_S, RETRY_S = 15, 10.0, 2.0


@dataclass
class Answer:
    data: bytes


class Leases:
    """`CoordinationV1Api`'s read and replace of one Lease, with optimistic concurrency."""

    def __init__(self, lease: dict[str, Any]) -> None:
        self.lease = lease

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> Answer:
        return Answer(json.dumps(self.lease).encode())

    def replace_namespaced_lease(
        self, name: str, namespace: str, body: dict[str, Any], **_: Any
    ) -> Answer:
        version = int(self.lease["metadata"]["resourceVersion"])
        if body["metadata"]["resourceVersion"] != str(version):
            raise AssertionError("a write from a Lease not read last")
        self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": str(version + 1)}}
        return Answer(json.dumps(self.lease).encode())


def held_by_a(renewed_at: float) -> dict[str, Any]:
    """The Lease as leader a left it: renewed at `renewed_at` (UTC seconds), in epoch 1."""
    from coordinator.lease import LeaseRecord, lease_object

    record = LeaseRecord("a", DURATION_S, renewed_at, renewed_at - 60, 1, "7")
    return lease_object(record, {"metadata": {"name": "l", "namespace": "default"}})


@pytest.mark.parametrize("first_read_after_s", [0.1, 1.0, 1.9])
def test_a_standby_takes_over_within_the_duration_and_a_retry_period(
    first_read_after_s: float,
) -> None:
    """Leader a renewed at 1000 and died. Standby b, polling every retry period, first saw that
    renewal up to a retry period later (its previous read came just before it); it must not
    then wait up to one more retry period past the claim's lapse before it tries again."""
    from kubernetes import client

    now = [1000.0 + first_read_after_s]
    elector = LeaderElector(
        SimpleNamespace(configuration=client.Configuration()),
        "default",
        "l",
        "b",
        DURATION_S,
        RENEW_S,
        RETRY_S,
        clock=lambda: now[0],
        monotonic=lambda: now[0],
    )
    leases = Leases(held_by_a(1000.0))
    elector._api = leases  # the API server, kept in memory
    try:
        for _ in range(20):  # as the elector's thread: attempt, then pause (bounded)
            elector._attempt()
            if elector.is_leader():
                break
            now[0] += elector._pause()
        assert elector.is_leader(), "b never took the Lease"
        assert leases.lease["spec"]["holderIdentity"] == "b"
        took = now[0] - 1000.0
        assert DURATION_S < took <= DURATION_S + RETRY_S, f"took over {took:.2f} s after renewal"
    finally:
        elector.stop()
