"""Leader election: the pure decision core by tables, the elector against a real kube-apiserver."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from baton.contract.kube import load_api_client
from commands.localnode.controlplane import ControlPlane
from coordinator.leader import LeaderElector
from coordinator.lease import (
    Action,
    Candidate,
    LeaseRecord,
    decide,
    expires_at,
    lease_object,
    lease_record,
)


def held(by: str = "b", renewed: float | None = 100.0, duration: int = 15) -> LeaseRecord:
    """A Lease in epoch 3, acquired at 50."""
    return LeaseRecord(by, duration, renewed, 50.0, transitions=3, resource_version="9")


ME, LEADING = Candidate("a", 15), Candidate("a", 15, term=3)
TAKE, RENEW, WAIT = Action.TAKE, Action.RENEW, Action.WAIT

# (lease as read, us, now, first seen at, what to do, the epoch it leaves in the Lease)
CASES: dict[str, tuple[LeaseRecord | None, Candidate, float, float | None, Action, int]] = {
    "fresh holder: wait": (held(), ME, 110.0, None, WAIT, 3),
    "at expiry exactly: still wait": (held(), ME, 115.0, None, WAIT, 3),
    "expired: take over, transitions + 1": (held(), ME, 115.5, None, TAKE, 4),
    "its own longer duration not over: wait": (held(duration=30), ME, 120.0, None, WAIT, 3),
    "renewTime old, but we saw it change late: wait": (held(), ME, 116.0, 110.0, WAIT, 3),
    "renewTime ahead of our clock, seen long ago: take": (held(renewed=900), ME, 116, 100, TAKE, 4),
    "holder without renewTime: take over": (held(renewed=None), ME, 1.0, None, TAKE, 4),
    "released (no holder): take over at once": (held(by=""), ME, 101.0, None, TAKE, 4),
    "absent: create in epoch 1": (None, ME, 1.0, None, TAKE, 1),
    "absent after we saw epoch 7: epoch 8": (None, Candidate("a", 15, None, 7), 1.0, None, TAKE, 8),
    "our own term: renew, keeping the epoch": (held("a"), LEADING, 110.0, None, RENEW, 3),
    "our own term, even late: renew": (held("a"), LEADING, 200.0, None, RENEW, 3),
    "ours, but we stepped down: re-take higher": (held("a"), ME, 110.0, None, TAKE, 4),
    "ours, past our term: re-take": (held("a"), Candidate("a", 15, 2), 110.0, None, TAKE, 4),
    "we led, another holds it fresh: wait": (held(), LEADING, 110.0, None, WAIT, 3),
    "we led, another's expired: take over": (held(), LEADING, 120.0, None, TAKE, 4),
}


@pytest.mark.parametrize("case", CASES)
def test_decide(case: str) -> None:
    lease, me, now, seen_at, action, epoch = CASES[case]
    decision = decide(lease, me, now, seen_at)
    assert (decision.action, decision.lease.transitions) == (action, epoch)
    if action is WAIT:
        assert decision.lease == lease
        return
    written = decision.lease
    assert (written.holder, written.renew_time, written.duration_s) == ("a", now, 15)
    assert written.resource_version == (lease.resource_version if lease else "")
    assert written.acquire_time == (now if action is TAKE else 50.0)


LEASES = st.builds(
    LeaseRecord,
    holder=st.sampled_from(["", "a", "b"]),
    duration_s=st.integers(0, 60),
    renew_time=st.none() | st.floats(0, 1000),
    transitions=st.integers(0, 50),
)
CANDIDATES = st.builds(Candidate, st.just("a"), st.just(15), st.none() | st.integers(1, 50))


@given(LEASES, CANDIDATES, st.integers(0, 60), st.floats(0, 2000), st.none() | st.floats(0, 1000))
def test_only_a_takeover_changes_the_epoch_and_it_always_rises(
    lease: LeaseRecord, me: Candidate, highest: int, now: float, seen: float | None
) -> None:
    me = Candidate(me.identity, me.lease_duration_s, me.term, highest)
    decision = decide(lease, me, now, seen)
    if decision.action is TAKE:
        assert decision.lease.transitions > max(lease.transitions, highest)
    else:
        assert decision.lease.transitions == lease.transitions
    if decision.action is WAIT:
        assert lease.holder == "b" and expires_at(lease, seen, 15) >= now
    if decision.action is RENEW:
        assert lease.holder == "a" and me.term == lease.transitions


def test_a_lease_survives_the_trip_through_json_to_the_microsecond() -> None:
    lease = LeaseRecord("a", 15, 1_700_000_000.0, 1_699_999_999.25, 4, "42")
    obj = lease_object(lease, {"metadata": {"labels": {"x": "y"}}, "spec": {"strategy": "S"}})
    assert obj["spec"]["renewTime"] == "2023-11-14T22:13:20.000000Z"
    assert obj["metadata"]["labels"] == {"x": "y"} and obj["spec"]["strategy"] == "S"
    assert lease_record(obj) == lease
    assert lease_object(LeaseRecord(), {})["spec"]["holderIdentity"] is None


BAD_ARGUMENTS: dict[str, tuple[dict[str, Any], str]] = {
    "renew deadline = lease": ({"lease_duration_s": 3, "renew_deadline_s": 3}, "renew_deadline_s"),
    "renew deadline > lease": ({"renew_deadline_s": 20}, "renew_deadline_s"),
    "retry >= deadline": ({"renew_deadline_s": 2, "retry_period_s": 2}, "retry_period_s"),
    "deadline <= 1.2 retries": ({"renew_deadline_s": 2.4, "retry_period_s": 2}, "retry_period_s"),
    "zero retry": ({"retry_period_s": 0}, "retry_period_s"),
    "fractional lease": ({"lease_duration_s": 2.5, "renew_deadline_s": 2}, "lease_duration_s"),
    "empty identity": ({"identity": ""}, "identity"),
    "empty namespace": ({"namespace": ""}, "namespace"),
    "empty name": ({"name": ""}, "name"),
}


@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_bad_arguments_are_named(case: str) -> None:
    changes, named = BAD_ARGUMENTS[case]
    args: dict[str, Any] = {"namespace": "default", "name": "l", "identity": "a", **changes}
    with pytest.raises(ValueError, match=f"^{named} ") as caught:
        LeaderElector(None, **args)
    assert "\n" not in str(caught.value)


# Against a real kube-apiserver.

FAST = {"lease_duration_s": 3, "renew_deadline_s": 2.0, "retry_period_s": 0.2}
WAIT_S = 10.0
"""The bound on any wait for something that should happen (it normally takes well under 1 s)."""


class Blackhole:
    """A TCP relay to the API server that can be cut: while `cut` is set it drops every byte
    both ways, so calls through it hang as across a network partition."""

    def __init__(self, port: int) -> None:
        self._target = ("127.0.0.1", port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"https://127.0.0.1:{self._listener.getsockname()[1]}"
        self.cut = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, name="blackhole")]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
                upstream = socket.create_connection(self._target, timeout=WAIT_S)
            except OSError:
                return
            upstream.settimeout(None)
            self._sockets += [conn, upstream]
            for src, dst in ((conn, upstream), (upstream, conn)):
                pump = threading.Thread(target=self._pump, args=(src, dst), name="blackhole")
                self._threads.append(pump)
                pump.start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if not self.cut.is_set():
                    dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Stop relaying; every thread ends (shutting a socket down wakes its blocked call)."""
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(WAIT_S)
        assert not any(t.is_alive() for t in self._threads), "the blackhole's threads hang"


@dataclass
class Campaigner:
    """One elector, and what its callbacks saw (with monotonic times)."""

    someone_leads: threading.Event
    elector: LeaderElector | None = None
    epochs: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    started_at: float = 0.0
    stopped_at: float = 0.0
    stopped: threading.Event = field(default_factory=threading.Event)

    @property
    def it(self) -> LeaderElector:
        assert self.elector is not None
        return self.elector

    def started_leading(self, epoch: int) -> None:
        self.epochs.append(epoch)
        self.started_at = time.monotonic()
        self.someone_leads.set()

    def stopped_leading(self, reason: str) -> None:
        self.reasons.append(reason)
        self.stopped_at = time.monotonic()
        self.stopped.set()


Campaign = Callable[..., Campaigner]


@pytest.fixture
def lease_name() -> str:
    return f"leader-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def someone_leads() -> threading.Event:
    return threading.Event()


@pytest.fixture
def blackhole(control_plane: ControlPlane) -> Iterator[Blackhole]:
    relay = Blackhole(control_plane.apiserver_port)
    yield relay
    relay.close()


@pytest.fixture
def campaign(
    control_plane: ControlPlane, lease_name: str, someone_leads: threading.Event
) -> Iterator[Campaign]:
    """Starts electors for this test's Lease (directly, or through a relay's URL); stops them all
    afterwards and checks their threads ended, also when the test failed."""
    made: list[Campaigner] = []
    clients: list[Any] = []

    def start(identity: str, via: str | None = None, **timing: Any) -> Campaigner:
        clients.append(load_api_client(str(control_plane.admin_kubeconfig)))
        clients[-1].configuration.host = via or clients[-1].configuration.host
        seen = Campaigner(someone_leads)
        made.append(seen)
        seen.elector = LeaderElector(
            clients[-1],
            "default",
            lease_name,
            identity,
            on_started_leading=seen.started_leading,
            on_stopped_leading=seen.stopped_leading,
            **(timing or FAST),
        )
        seen.elector.start()
        return seen

    yield start
    for each in made:
        each.it.stop(timeout=WAIT_S)
    for api_client in clients:
        api_client.close()
    left = [t.name for t in threading.enumerate() if t.name == f"leader-election-{lease_name}"]
    assert not left, f"elector threads still running: {left}"


def read_lease(control_plane: ControlPlane, name: str) -> LeaseRecord:
    from kubernetes import client

    api_client = load_api_client(str(control_plane.admin_kubeconfig))
    try:
        api: Any = client.CoordinationV1Api(api_client)
        answer = api.read_namespaced_lease(
            name, "default", _preload_content=False, _request_timeout=5
        )
        return lease_record(json.loads(answer.data))
    finally:
        api_client.close()


def test_exactly_one_of_two_leads(campaign: Campaign, someone_leads: threading.Event) -> None:
    a, b = campaign("a"), campaign("b")
    assert someone_leads.wait(WAIT_S), "neither elector took the Lease"
    leader, other = (a, b) if a.it.is_leader() else (b, a)
    assert not other.it.wait_leading(1.0)
    assert leader.it.is_leader() and leader.epochs == [1] and other.epochs == []


def test_stop_releases_the_lease_and_the_standby_takes_over_at_once(
    campaign: Campaign, control_plane: ControlPlane, lease_name: str
) -> None:
    slow = {"lease_duration_s": 30, "renew_deadline_s": 20.0, "retry_period_s": 0.2}
    a = campaign("a", **slow)
    assert a.it.wait_leading(WAIT_S)
    b = campaign("b", **slow)
    a.it.stop(timeout=WAIT_S)
    assert a.reasons == ["the elector stopped"] and not a.it.is_leader()
    # Far sooner than the 30 s Lease could expire: only the release lets b in.
    assert b.it.wait_leading(WAIT_S)
    assert b.epochs == [a.it.epoch + 1]
    lease = read_lease(control_plane, lease_name)
    assert (lease.holder, lease.transitions) == ("b", b.it.epoch)


def test_a_cut_off_leader_steps_down_before_the_other_takes_over(
    blackhole: Blackhole,  # first: it outlives the electors, so a can release the Lease at the end
    campaign: Campaign,
    control_plane: ControlPlane,
    lease_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="coordinator.leader")
    set_back = [0.0]
    a = campaign("a", via=blackhole.url, clock=lambda: time.time() - set_back[0], **FAST)
    assert a.it.wait_leading(WAIT_S)
    b = campaign("b")
    set_back[0] = 3600.0  # a's wall clock is set back an hour: its term ends all the same
    blackhole.cut.set()  # a's calls now hang; b still reaches the API server

    assert a.stopped.wait(WAIT_S), "the cut-off leader never stepped down"
    assert not a.it.is_leader()
    assert b.it.wait_leading(WAIT_S), "the standby never took over the expired Lease"
    assert a.stopped_at < b.started_at
    assert a.reasons[0].startswith(f"could not renew Lease default/{lease_name} for 2 s (API ")
    assert b.epochs == [a.epochs[0] + 1]
    lease = read_lease(control_plane, lease_name)
    assert (lease.holder, lease.transitions) == ("b", b.epochs[0])

    outage = [r for r in caplog.records if "leader election for" in r.getMessage()]
    assert [r.levelname for r in outage] == ["WARNING"], "one warning per outage"
    assert all(r.exc_info is None for r in caplog.records), "no tracebacks"

    # Healed, a waits its turn; when b goes, a leads again in a still higher epoch.
    blackhole.cut.clear()
    b.it.stop(timeout=WAIT_S)
    assert a.it.wait_leading(WAIT_S)
    assert a.epochs == [1, 3] and read_lease(control_plane, lease_name).transitions == 3


def test_a_leader_outranked_by_the_agents_takes_the_lease_again_above_them(
    campaign: Campaign, control_plane: ControlPlane, lease_name: str
) -> None:
    """A Lease recreated by hand counts from epoch 1 again; the agents' epoch is higher."""
    a = campaign("a")
    assert a.it.wait_leading(WAIT_S) and a.epochs == [1]
    a.it.outrank(7)
    assert a.stopped.wait(WAIT_S), "the outranked leader did not step down"
    deadline = time.monotonic() + WAIT_S
    while len(a.epochs) < 2 and time.monotonic() < deadline:
        threading.Event().wait(0.05)  # polls the callbacks' record, bounded
    assert a.epochs == [1, 8]
    assert read_lease(control_plane, lease_name).transitions == 8


def test_the_lease_carries_what_the_leader_annotates_to_the_next_one(
    campaign: Campaign, control_plane: ControlPlane, lease_name: str
) -> None:
    carried = {"baton.dev/fair-clocks": '{"vtime":{"team/rl":1.5}}'}
    a = campaign("a", annotate=lambda: carried, **FAST)
    assert a.it.wait_leading(WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:  # the first renewal writes it, bounded
        lease = read_lease_object(control_plane, lease_name)
        if lease["metadata"].get("annotations", {}) == carried:
            break
        threading.Event().wait(0.05)
    assert lease["metadata"].get("annotations", {}) == carried
    b = campaign("b", **FAST)
    a.it.stop(timeout=WAIT_S)
    assert b.it.wait_leading(WAIT_S)
    assert b.it.inherited == carried


def read_lease_object(control_plane: ControlPlane, name: str) -> dict[str, Any]:
    from kubernetes import client

    api_client = load_api_client(str(control_plane.admin_kubeconfig))
    try:
        api: Any = client.CoordinationV1Api(api_client)
        answer = api.read_namespaced_lease(
            name, "default", _preload_content=False, _request_timeout=5
        )
        found: dict[str, Any] = json.loads(answer.data)
        return found
    finally:
        api_client.close()
