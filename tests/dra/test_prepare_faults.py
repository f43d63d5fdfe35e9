"""What a prepare meets besides a good claim: an API server that fails, a node not read yet,
directories the driver cannot write, an unprepare of the same claim at the same time."""

from __future__ import annotations

import dataclasses
import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError, NewConnectionError

from dra.cdi import spec_path
from dra.daemon import DraStartError, Driver
from tests.dra.test_driver import GPUS, WAIT_S, Claims, _settings, _start
from tests.dra.test_slices import Slices
from tests.harness.drakubelet import DraKubeletStub


class FailingClaims(Claims):
    """Claims whose read fails, for the names in `failures`, with the error given."""

    def __init__(self) -> None:
        super().__init__()
        self.failures: dict[str, Exception] = {}

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        if name in self.failures:
            raise self.failures[name]
        return super().read_claim(namespace, name)


def test_a_claim_the_api_server_fails_to_read_is_one_claims_error_in_one_line(
    tmp_path: Path, kubelet: DraKubeletStub
) -> None:
    """The kubelet shows each claim's error in the pod's events; an API failure reading one
    claim must not fail the other claims of the call, nor reach the kubelet as a traceback."""
    claims = FailingClaims()
    claims.add("ns", "ok", "uid-ok", "gpu-0")
    claims.failures["denied"] = ApiException(status=403, reason="Forbidden")
    refused = "Failed to establish a new connection: refused"
    cut = MaxRetryError(None, "/apis", NewConnectionError(None, refused))  # type: ignore[arg-type]
    claims.failures["cut"] = cut
    driver = _start(tmp_path, claims, Slices())
    try:
        kubelet.register()
        answer = kubelet.prepare(
            ("ns", "uid-ok", "ok"), ("ns", "uid-d", "denied"), ("ns", "uid-c", "cut")
        ).claims
        assert answer["uid-ok"].error == ""
        denied, cut = answer["uid-d"].error, answer["uid-c"].error
        assert "claim ns/denied: cannot read it" in denied and "403 Forbidden" in denied, denied
        assert "claim ns/cut: cannot read it" in cut and "unreachable" in cut, cut
        assert "\n" not in denied + cut
        assert not spec_path(tmp_path / "cdi", "uid-d").exists()
    finally:
        driver.stop()


class NodeApi:
    """The node as the API server answers it: failing until `answers` is set."""

    def __init__(self) -> None:
        self.answers: dict[str, Any] | None = None
        self.reads = 0

    def node(self) -> dict[str, Any]:
        self.reads += 1
        if self.answers is None:
            raise ApiException(status=503, reason="Service Unavailable")
        return self.answers


def test_a_node_the_api_server_did_not_answer_for_at_start_is_read_at_the_next_prepare(
    tmp_path: Path, kubelet: DraKubeletStub
) -> None:
    """The runtime check needs the node's runtime version: a driver that started during an
    API outage refuses claims saying why, and prepares them once the node can be read."""
    claims, node = Claims(), NodeApi()
    claims.add("ns", "c1", "uid-1", "gpu-0")
    claims.add("ns", "c2", "uid-2", "gpu-1")
    settings = _settings(tmp_path, runtime_cdi="auto")
    api: Any = node
    driver = Driver(settings, GPUS, True, api=api, slices=Slices(), claims=claims)
    driver.start()
    try:
        kubelet.register()
        refused = kubelet.prepare(("ns", "uid-1", "c1")).claims["uid-1"].error
        assert "container runtime is not known yet" in refused, refused
        assert "503 Service Unavailable" in refused, refused
        node.answers = {"metadata": {"uid": "node-uid"}, "status": {"nodeInfo": {}}}
        refused = kubelet.prepare(("ns", "uid-1", "c1")).claims["uid-1"].error
        assert "names no container runtime yet" in refused, refused
        node.answers["status"]["nodeInfo"]["containerRuntimeVersion"] = "containerd://2.3.4"
        assert kubelet.prepare(("ns", "uid-1", "c1")).claims["uid-1"].error == ""
        assert spec_path(tmp_path / "cdi", "uid-1").exists()
        reads = node.reads
        assert kubelet.prepare(("ns", "uid-2", "c2")).claims["uid-2"].error == ""
        assert node.reads == reads, "a node read once is not read again"
    finally:
        driver.stop()


@pytest.mark.parametrize(
    ("field", "flag"), [("state_dir", "--state-dir"), ("cdi_dir", "--cdi-dir")]
)
def test_a_directory_the_driver_cannot_write_stops_it_at_start_naming_the_flag(
    tmp_path: Path, field: str, flag: str
) -> None:
    """Started, it would publish its slice and then fail every claim the scheduler gives it."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    changed: dict[str, Any] = {field: blocker / "dir"}
    settings = dataclasses.replace(_settings(tmp_path), **changed)
    with pytest.raises(DraStartError, match=flag) as refused:
        Driver(settings, GPUS, True, slices=Slices(), claims=Claims())
    assert str(blocker / "dir") in str(refused.value)


def test_a_claim_that_cannot_be_recorded_leaves_no_spec_and_says_where(
    tmp_path: Path, kubelet: DraKubeletStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spec whose claim is not recorded would never be unprepared: it goes with the error."""
    claims = Claims()
    claims.add("ns", "c1", "uid-1", "gpu-0")
    driver = _start(tmp_path, claims, Slices())
    try:
        kubelet.register()

        def full_disk(*_: object) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(driver.record, "_save", full_disk)
        error = kubelet.prepare(("ns", "uid-1", "c1")).claims["uid-1"].error
        assert f"claim ns/c1: cannot record it in {driver.record.path}" in error, error
        assert "No space left on device" in error, error
        assert list((tmp_path / "cdi").iterdir()) == [], "no spec (nor its temporary) is left"
        monkeypatch.undo()
        assert kubelet.prepare(("ns", "uid-1", "c1")).claims["uid-1"].error == ""
        assert spec_path(tmp_path / "cdi", "uid-1").exists()
        monkeypatch.setattr(driver.record, "_save", full_disk)
        error = kubelet.unprepare(("ns", "uid-1", "c1")).claims["uid-1"].error
        assert f"claim ns/c1: cannot drop it from {driver.record.path}" in error, error
        monkeypatch.undo()
        assert kubelet.unprepare(("ns", "uid-1", "c1")).claims["uid-1"].error == ""
        assert driver.record.get("uid-1") is None
    finally:
        driver.stop()


def test_a_record_the_driver_cannot_read_stops_it_at_start_naming_the_flag(
    tmp_path: Path,
) -> None:
    (tmp_path / "state" / "prepared-claims.json").mkdir(parents=True)
    with pytest.raises(DraStartError, match="--state-dir") as refused:
        Driver(_settings(tmp_path), GPUS, True, slices=Slices(), claims=Claims())
    assert "prepared-claims.json" in str(refused.value)


def test_an_unprepare_that_comes_during_the_claims_prepare_waits_for_it(
    tmp_path: Path, kubelet: DraKubeletStub
) -> None:
    """A pod's unprepare arriving while another pod's prepare of the same claim is between its
    spec and its record removed the spec and an empty record, then the prepare recorded the
    claim: prepared on the node for good though the kubelet heard it unprepared."""
    claims = Claims()
    claims.add("ns", "c1", "uid-1", "gpu-0")
    driver = _start(tmp_path, claims, Slices())
    held, unprepared = threading.Event(), threading.Event()

    def hold(uid: str) -> None:  # between the spec and the record, until the unprepare is done
        held.set()
        unprepared.wait(2.0)  # it is not, while this prepare runs: the bound lets it go on

    driver.preparer.between = hold
    answers: dict[str, Any] = {}
    try:
        kubelet.register()
        preparing = threading.Thread(
            target=lambda: answers.update(prepared=kubelet.prepare(("ns", "uid-1", "c1")))
        )
        preparing.start()
        assert held.wait(WAIT_S)
        answers["unprepared"] = kubelet.unprepare(("ns", "uid-1", "c1"))
        unprepared.set()
        preparing.join(WAIT_S)
        assert answers["prepared"].claims["uid-1"].error == ""
        assert answers["unprepared"].claims["uid-1"].error == ""
        assert driver.record.get("uid-1") is None, "the claim stayed prepared"
        assert not spec_path(tmp_path / "cdi", "uid-1").exists()
    finally:
        driver.stop()


def test_a_claim_that_failed_to_record_is_not_answered_prepared_while_the_record_still_fails(
    tmp_path: Path, kubelet: DraKubeletStub
) -> None:
    """The kubelet retries a failed prepare (and unprepare): while the record still cannot be
    written, the retry fails too, rather than answer from what the failed write left in memory
    (a claim prepared but not recorded: its spec removed as an orphan at the next start; a
    claim unprepared on the kubelet's word but still recorded on disk)."""
    claims = Claims()
    claims.add("ns", "c1", "uid-1", "gpu-0")
    claims.add("ns", "c2", "uid-2", "gpu-1")
    driver = _start(tmp_path, claims, Slices())
    blocked = tmp_path / "state" / "prepared-claims.tmp"  # the record's next write cannot land
    try:
        kubelet.register()
        assert kubelet.prepare(("ns", "uid-2", "c2")).claims["uid-2"].error == ""
        blocked.mkdir()
        for _ in range(2):
            error = kubelet.prepare(("ns", "uid-1", "c1")).claims["uid-1"].error
            assert f"claim ns/c1: cannot record it in {driver.record.path}" in error, error
            assert not spec_path(tmp_path / "cdi", "uid-1").exists()
        for _ in range(2):
            error = kubelet.unprepare(("ns", "uid-2", "c2")).claims["uid-2"].error
            assert f"claim ns/c2: cannot drop it from {driver.record.path}" in error, error
        blocked.rmdir()
        assert kubelet.unprepare(("ns", "uid-2", "c2")).claims["uid-2"].error == ""
    finally:
        driver.stop()
    again = _start(tmp_path, claims, Slices())
    try:
        assert again.record.uids() == [], "the record on disk holds what the kubelet was told"
    finally:
        again.stop()
