"""Two jobs crossing on two nodes while the coordinators' leader is killed again and again:
no two jobs ever compute at once on a node, and every turn is either had or refused with a
reason. Real parts: a kube-apiserver, `baton agent` processes for the nodes, two `baton
coordinator` processes (the killed one restarted), llm-d's client finding the leader as a
Service would (the replica that answers).

`make test` kills the leader once; `make soak` for ten minutes, every 30 s.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from commands.localnode.controlplane import ControlPlane
from commands.localnode.procs import wait_for
from coordinator.agents import NodeFailed
from tests.agent.server.llmd.llmd_client import TimeSliceOrchestratorClient
from tests.coordinator.conftest import TEAM, control_plane, core
from tests.coordinator.deployed import CoordinatorProcess, leader_of, members_known
from tests.coordinator.nodes import AgentNode, agent_nodes, job_pod
from tests.reliability import figures

__all__ = ["control_plane", "core"]  # the fixtures this module uses, from tests/coordinator

JOBS = ("ja", "jb")
ACQUIRE_S = 30.0
COMPUTE_S = 0.01
RUNS = [
    pytest.param(20.0, 12.0, id="one-kill"),
    pytest.param(600.0, 30.0, id="soak", marks=[pytest.mark.soak, pytest.mark.timeout(900)]),
]


class Service:
    """llm-d's client against whichever coordinator leads, as a Service selecting it would."""

    def __init__(self, addresses: list[str]) -> None:
        self._clients = [TimeSliceOrchestratorClient(a) for a in addresses]
        self._at = 0

    def call(self, what: str, job: str, deadline: float) -> str:
        """ "" once `what` (acquire or release) succeeded; else the last refusal's reason, once
        no replica would do it before `deadline`. UNAVAILABLE (no leader, not this one) moves
        on to the other replica."""
        why = "not tried"
        while time.monotonic() < deadline:
            client = self._clients[self._at]
            try:
                if what == "acquire":
                    client.acquire(job, "", timeout_sec=max(0.1, deadline - time.monotonic()))
                else:
                    client.release(job, "", timeout_sec=5)
                return ""
            except grpc.RpcError as err:
                code, details = err.code(), err.details()
                why = f"{code.name}: {details}"
                assert details, f"{what} of {job} refused with no reason ({code.name})"
                if code != grpc.StatusCode.UNAVAILABLE:
                    return why
                self._at = (self._at + 1) % len(self._clients)
                threading.Event().wait(0.05)  # the next replica, or a leader being elected
        return why

    def close(self) -> None:
        for client in self._clients:
            client.close()


class Record:
    """What the job loops saw: their computing intervals, and the refusals with reasons."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.intervals: dict[str, list[tuple[float, float]]] = {job: [] for job in JOBS}
        self.refusals: list[str] = []
        self.stop = threading.Event()

    def overlaps(self) -> list[str]:
        found = []
        for a0, a1 in self.intervals[JOBS[0]]:
            for b0, b1 in self.intervals[JOBS[1]]:
                if a0 < b1 and b0 < a1:
                    found.append(
                        f"{JOBS[0]} [{a0:.4f}, {a1:.4f}] and {JOBS[1]} [{b0:.4f}, {b1:.4f}]"
                    )
        return found


def loop(job: str, service: Service, record: Record) -> None:
    while not record.stop.is_set():
        why = service.call("acquire", job, time.monotonic() + ACQUIRE_S)
        if why:
            with record.lock:
                record.refusals.append(f"acquire {job}: {why}")
            continue
        began = time.monotonic()
        record.stop.wait(COMPUTE_S)  # computing in the turn
        ended = time.monotonic()
        with record.lock:
            record.intervals[job].append((began, ended))
        why = service.call("release", job, time.monotonic() + ACQUIRE_S)
        if why and "does not hold" not in why:  # ended by a new leader's roll-back: fine
            with record.lock:
                record.refusals.append(f"release {job}: {why}")


def one_turn_per_node(nodes: list[AgentNode], record: Record, seen: list[str]) -> None:
    """The agents' own view, read all along: a node (one GPU) holds at most one job's turn."""
    while not record.stop.wait(0.1):
        for node in nodes:
            try:
                turns = node.report().turns
            except NodeFailed:  # that agent is busy or restarting: read it on the next round
                continue
            if len({t.job for t in turns}) > 1:
                seen.append(f"{node.name}: " + ", ".join(f"{t.job}@{t.epoch}" for t in turns))


@pytest.mark.parametrize(("seconds", "kill_every"), RUNS)
def test_crossed_jobs_never_overlap_while_the_leader_is_killed(
    control_plane: ControlPlane, core: Any, tmp_path: Path, seconds: float, kill_every: float
) -> None:
    cp = control_plane
    suffix = "soak" if seconds > 60 else "once"
    names = [f"x1-{suffix}", f"x2-{suffix}"]
    with agent_nodes(cp, tmp_path, names) as nodes:
        for job in JOBS:
            for i, node in enumerate(nodes):
                job_pod(core, TEAM, f"{job}-{suffix}-{i}", node, job)
        members_known(
            nodes,
            {n.name: {f"team/{j}-{suffix}-{i}" for j in JOBS} for i, n in enumerate(nodes)},
        )
        pair = [CoordinatorProcess(cp, tmp_path, f"c{x}-{suffix}", f"lease-{suffix}") for x in "ab"]
        for each in pair:
            each.process.start()
        record, bad_nodes = Record(), list[str]()
        service = Service([c.address for c in pair])
        threads = [threading.Thread(target=loop, args=(j, service, record)) for j in JOBS]
        threads.append(threading.Thread(target=one_turn_per_node, args=(nodes, record, bad_nodes)))
        kills = 0
        try:
            leader_of(pair)
            for thread in threads:
                thread.start()
            end = time.monotonic() + seconds
            while time.monotonic() + kill_every < end:
                record.stop.wait(kill_every)
                leader = leader_of(pair)
                os.kill(leader.process.pid, signal.SIGKILL)
                leader.process.stop()
                leader.process.start()  # a Deployment would restart it
                kills += 1
            record.stop.wait(max(0.0, end - time.monotonic()))
        finally:
            record.stop.set()
            for thread in threads:
                thread.join(2 * ACQUIRE_S)
            service.close()
            for each in pair:
                each.process.stop()
        turns = {job: len(record.intervals[job]) for job in JOBS}
        figures.record(
            "faults",
            f"coordinator leader SIGKILLed every {kill_every:g} s for {seconds:g} s, "
            "two jobs crossing on two nodes",
            {
                "leader_kills": kills,
                "turns": sum(turns.values()),
                "refusals_with_reason": len(record.refusals),
                "overlapping_turns": len(record.overlaps()),
                "nodes_with_two_jobs": len(bad_nodes),
            },
        )
        assert kills >= 1
        assert all(turns.values()), f"a job had no turn: {turns}; refusals {record.refusals[-5:]}"
        assert not record.overlaps(), record.overlaps()[:5]
        assert not bad_nodes, bad_nodes[:5]
        wait_for(
            "no thread left", lambda: True if not any(t.is_alive() for t in threads) else None, 5
        )
