"""Two drivers on one node at once (a DaemonSet rollout: the new pod starts while the old one is
still stopping): they share the state directory and the CDI directory, so the new one must not
read the record, or judge which specs are orphans, while the old one may still prepare."""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from baton.contract.shutdown import StopSignal
from dra import daemon
from dra.cdi import spec_path
from dra.daemon import DraStartError, DraStoppedAtStart, Driver
from dra.record import ClaimRecord
from tests.dra.test_driver import GPUS, WAIT_S, Claims, _settings, _start
from tests.dra.test_slices import Slices
from tests.harness.drakubelet import DraKubeletStub


class GatedClaims(Claims):
    """Claims whose read waits for `gate` once `hold` is set (a prepare in flight)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold, self.reading, self.gate = threading.Event(), threading.Event(), threading.Event()

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.hold.is_set():
            self.reading.set()
            assert self.gate.wait(WAIT_S)
        return super().read_claim(namespace, name)


class Flag(logging.Handler):
    """Sets `event` when a record of `logger_name` is logged."""

    def __init__(self, logger_name: str, event: threading.Event) -> None:
        super().__init__()
        self.logger_name, self.event = logger_name, event

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == self.logger_name:
            self.event.set()


def test_a_driver_started_while_the_old_one_still_prepares_keeps_the_old_ones_claim(
    tmp_path: Path,
) -> None:
    """The old driver finished a prepare after the new one had read the record: the new one
    wrote its record without that claim, and at its next start removed the claim's spec as an
    orphan while the pod ran (a container of it restarting then fails: unresolvable CDI
    devices). The new driver must wait for the old one to stop before it reads the record."""
    claims, slices = GatedClaims(), Slices()
    claims.add("ns", "c1", "uid-1", "gpu-0")
    claims.add("ns", "c2", "uid-2", "gpu-1")
    old = _start(tmp_path, claims, slices)
    kubelet = DraKubeletStub(tmp_path / "plugins_registry")
    made: list[Driver] = []
    answers: list[Any] = []
    settled = threading.Event()  # the new driver started, or is waiting for the old one
    flag = Flag("dra.statelock", settled)
    logging.getLogger("dra.statelock").addHandler(flag)

    def start_new() -> None:
        made.append(Driver(_settings(tmp_path), GPUS, True, slices=slices, claims=claims))
        made[0].start()
        settled.set()

    in_flight = threading.Thread(
        target=lambda: answers.append(kubelet.prepare(("ns", "uid-1", "c1")))
    )
    new_pod = threading.Thread(target=start_new)
    try:
        kubelet.register()
        claims.hold.set()
        in_flight.start()
        assert claims.reading.wait(WAIT_S)
        new_pod.start()
        assert settled.wait(WAIT_S)
        claims.hold.clear()
        claims.gate.set()
        in_flight.join(WAIT_S)
        assert answers[0].claims["uid-1"].error == ""
        old.stop()  # the old pod's SIGTERM, its prepare answered
        new_pod.join(WAIT_S)
        assert made and not new_pod.is_alive()
        kubelet.close()
        kubelet.register()
        assert kubelet.prepare(("ns", "uid-2", "c2")).claims["uid-2"].error == ""
        assert sorted(ClaimRecord(tmp_path / "state").uids()) == ["uid-1", "uid-2"]
        made.pop().stop()
        _start(tmp_path, claims, slices).stop()  # its next start
        assert spec_path(tmp_path / "cdi", "uid-1").exists(), "a running claim's spec kept"
    finally:
        logging.getLogger("dra.statelock").removeHandler(flag)
        claims.gate.set()
        kubelet.close()
        in_flight.join(WAIT_S)
        new_pod.join(WAIT_S)
        for driver in made:
            driver.stop()
        old.stop()


def test_a_second_driver_on_a_state_directory_in_use_is_refused_naming_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two drivers that both keep running (two installs on one node): the second waits for the
    first to stop, then refuses to start, in one line naming the lock and who holds it."""
    monkeypatch.setattr(daemon, "LOCK_WAIT_S", 0.2)
    first = _start(tmp_path, Claims(), Slices())
    try:
        with pytest.raises(DraStartError) as refused:
            Driver(_settings(tmp_path), GPUS, True, slices=Slices(), claims=Claims())
    finally:
        first.stop()
    message = str(refused.value)
    assert str(tmp_path / "state" / "dra.lock") in message and "PID" in message, message
    assert "\n" not in message
    again = _start(tmp_path, Claims(), Slices())  # the first one gone, the lock is free
    again.stop()


def test_a_driver_waiting_for_the_state_directory_stops_at_a_stop_signal(tmp_path: Path) -> None:
    """A new pod deleted while it waits for the old driver (a rollout undone) stops at its
    SIGTERM, saying so, rather than at the end of its wait or its grace."""
    first = _start(tmp_path, Claims(), Slices())
    stop = StopSignal()
    try:
        threading.Timer(0.2, stop.handle, args=(signal.SIGTERM,)).start()
        began = time.monotonic()
        with pytest.raises(DraStoppedAtStart) as stopped:
            Driver(_settings(tmp_path), GPUS, True, slices=Slices(), claims=Claims(), stop=stop)
        waited = time.monotonic() - began
    finally:
        first.stop()
    assert waited < daemon.LOCK_WAIT_S / 2, f"stopped after {waited:.1f} s"
    assert "stopped on SIGTERM while another driver" in str(stopped.value)
    again = _start(tmp_path, Claims(), Slices())  # nothing of the stopped one is left
    again.stop()


def test_a_prepare_that_outlives_its_drivers_stop_writes_nothing(tmp_path: Path) -> None:
    """A rollout while the API server is slow: the old driver stopped (its gRPC call cut at the
    end of its grace) and let the state directory go while a prepare of it still read its
    claim; that prepare then wrote its spec and its record over the new driver's, so the claim
    the new driver had prepared meanwhile was gone from the record (and its spec removed as an
    orphan at the next start, its pod running). A prepare ending after its driver stopped
    writes nothing; the kubelet's retry is the new driver's."""
    claims, slices = GatedClaims(), Slices()
    claims.add("ns", "c1", "uid-1", "gpu-0")
    claims.add("ns", "c2", "uid-2", "gpu-1")
    old = _start(tmp_path, claims, slices)
    kubelet = DraKubeletStub(tmp_path / "plugins_registry")
    cut: list[Any] = []

    def in_flight() -> None:
        try:
            kubelet.prepare(("ns", "uid-1", "c1"))
        except grpc.RpcError as err:  # cut by the old driver's stop
            cut.append(err.code())

    asking = threading.Thread(target=in_flight)
    new: list[Driver] = []
    try:
        kubelet.register()
        claims.hold.set()
        asking.start()
        assert claims.reading.wait(WAIT_S)
        old.stop()  # its grace over: the call is cut, its claim's read goes on
        asking.join(WAIT_S)
        assert cut == [grpc.StatusCode.UNAVAILABLE]
        new.append(_start(tmp_path, claims, slices))
        claims.hold.clear()
        kubelet.close()
        kubelet.register()
        assert kubelet.prepare(("ns", "uid-2", "c2")).claims["uid-2"].error == ""
        claims.gate.set()  # the old driver's read answers
        for thread in threading.enumerate():
            if thread.name.startswith("dra-prepare"):
                thread.join(WAIT_S)
        assert ClaimRecord(tmp_path / "state").uids() == ["uid-2"]
        assert not spec_path(tmp_path / "cdi", "uid-1").exists()
    finally:
        claims.gate.set()
        kubelet.close()
        asking.join(WAIT_S)
        for driver in new:
            driver.stop()
        old.stop()
