"""The driver against the kubelet stub: registration, slices, prepare/unprepare, record, health."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from baton.contract import names
from dra.cdi import spec_path
from dra.daemon import Driver, Settings
from dra.record import ClaimRecord
from dra.runtime import ON
from dra.slices import slice_name
from nodegpu.inventory import NodeGpu
from tests.deviceplugin.test_kubelet_flow import post
from tests.dra.test_slices import Slices
from tests.harness.drakubelet import DraKubeletStub

GPUS = [NodeGpu("GPU-a", 0, "Fake", 81920), NodeGpu("GPU-b", 1, "Fake", 81920)]
WAIT_S = 10.0


class Claims:
    """ResourceClaims by namespace/name."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], dict[str, Any]] = {}

    def add(self, namespace: str, name: str, uid: str, *devices: str) -> None:
        results = [
            {
                "request": "gpu",
                "driver": names.DRA_DRIVER,
                "pool": "n1",
                "device": d,
                "shareID": f"share-{d}",
                "consumedCapacity": {"memory": "30Gi", "duty": "30", "slots": "1"},
            }
            for d in devices
        ]
        self.items[(namespace, name)] = {
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": results}}},
        }

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.items.get((namespace, name))


def _settings(tmp: Path, runtime_cdi: str = ON) -> Settings:
    return Settings(
        node_name="n1",
        plugins_dir=tmp / "plugins",
        registry_dir=tmp / "plugins_registry",
        cdi_dir=tmp / "cdi",
        state_dir=tmp / "state",
        metrics_host="127.0.0.1",
        metrics_port=0,
        runtime_cdi=runtime_cdi,
    )


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    # unix socket paths must stay short
    return tmp_path


def _start(tmp: Path, claims: Claims, slices: Slices, runtime_cdi: str = ON) -> Driver:
    driver = Driver(_settings(tmp, runtime_cdi), GPUS, True, slices=slices, claims=claims)
    driver.start()
    return driver


@pytest.fixture
def world(tmp: Path) -> Iterator[tuple[Driver, DraKubeletStub, Claims, Slices]]:
    claims, slices = Claims(), Slices()
    driver = _start(tmp, claims, slices)
    kubelet = DraKubeletStub(tmp / "plugins_registry")
    yield driver, kubelet, claims, slices
    kubelet.close()
    driver.stop()


def test_registration_publishes_the_slice_and_opens_health(world: Any) -> None:
    driver, kubelet, _, slices = world
    info = kubelet.register()
    assert info.name == names.DRA_DRIVER and "v1.DRAPlugin" in info.supported_versions
    assert driver.publisher.published.wait(WAIT_S)
    assert slice_name("n1") in slices.items
    assert kubelet.wait_health(1)
    first = kubelet.health_reports[0]
    assert [(d.device.device_name, d.health) for d in first.devices] == [("gpu-0", 1), ("gpu-1", 1)]


def test_kubelet_restart_deletes_slices_and_registration_publishes_again(world: Any) -> None:
    driver, kubelet, _, slices = world
    kubelet.register()
    assert driver.publisher.published.wait(WAIT_S)
    slices.items.clear()
    kubelet.close()
    kubelet.register()
    assert driver.publisher.published.wait(WAIT_S)
    assert slice_name("n1") in slices.items and driver.registration.count == 2


def test_prepare_writes_the_claims_spec_and_unprepare_removes_it(world: Any, tmp: Path) -> None:
    _, kubelet, claims, _ = world
    kubelet.register()
    claims.add("ns", "c1", "uid-1", "gpu-1")
    answer = kubelet.prepare(("ns", "uid-1", "c1")).claims["uid-1"]
    assert answer.error == ""
    (device,) = answer.devices
    assert (device.pool_name, device.device_name, device.share_id) == ("n1", "gpu-1", "share-gpu-1")
    claim_id, own_id = f"{names.CDI_KIND_CLAIM}=uid-1", f"{names.CDI_KIND_CLAIM}=uid-1-gpu-1"
    assert list(device.cdi_device_ids) == [own_id, claim_id]  # its own first: health names it
    spec = json.loads(spec_path(tmp / "cdi", "uid-1").read_text())
    assert [d["name"] for d in spec["devices"]] == ["uid-1", "uid-1-gpu-1"]
    assert spec["devices"][1]["containerEdits"] == {"env": ["BATON_CLAIM_GPU_1=GPU-b"]}
    edits = spec["devices"][0]["containerEdits"]
    assert f"{names.ENV_GPUS}=GPU-b" in edits["env"]
    assert f"{names.ENV_AGENT_SOCKET}={names.AGENT_SOCKET}" in edits["env"]
    assert edits["mounts"][0]["hostPath"] == names.AGENT_SOCKET_DIR
    assert kubelet.unprepare(("ns", "uid-1", "c1")).claims["uid-1"].error == ""
    assert not spec_path(tmp / "cdi", "uid-1").exists()
    assert kubelet.unprepare(("ns", "uid-1", "c1")).claims["uid-1"].error == "", "idempotent"


def test_each_gpu_of_a_claim_has_its_own_first_cdi_id(world: Any, tmp: Path) -> None:
    """The kubelet names a device's health by its result's first CDI ID and drops repeats: a
    claim of two GPUs returns two distinct first IDs, each followed by the claim's (env and
    mount), which a container naming only one of the claim's requests needs too."""
    _, kubelet, claims, _ = world
    kubelet.register()
    claims.add("ns", "c2", "uid-2", "gpu-0", "gpu-1")
    first, second = kubelet.prepare(("ns", "uid-2", "c2")).claims["uid-2"].devices
    kind = names.CDI_KIND_CLAIM
    assert list(first.cdi_device_ids) == [f"{kind}=uid-2-gpu-0", f"{kind}=uid-2"]
    assert list(second.cdi_device_ids) == [f"{kind}=uid-2-gpu-1", f"{kind}=uid-2"]
    spec = json.loads(spec_path(tmp / "cdi", "uid-2").read_text())
    by_name = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert f"{names.ENV_GPUS}=GPU-a,GPU-b" in by_name["uid-2"]["env"]
    assert by_name["uid-2-gpu-0"] == {"env": ["BATON_CLAIM_GPU_0=GPU-a"]}
    assert by_name["uid-2-gpu-1"] == {"env": ["BATON_CLAIM_GPU_1=GPU-b"]}


def test_a_result_of_a_sub_request_is_answered_under_its_main_request(world: Any) -> None:
    """A request with `firstAvailable` is allocated as `<request>/<sub-request>`; containers
    name the main request, and the kubelet gives a container only the devices whose request
    names hold that name: the answer names the main request, or the container gets none."""
    _, kubelet, claims, _ = world
    kubelet.register()
    claims.add("ns", "c3", "uid-3", "gpu-0")
    results = claims.items[("ns", "c3")]["status"]["allocation"]["devices"]["results"]
    results[0]["request"] = "gpu/big"
    answer = kubelet.prepare(("ns", "uid-3", "c3")).claims["uid-3"]
    assert answer.error == ""
    (device,) = answer.devices
    assert list(device.request_names) == ["gpu"]
    again = kubelet.prepare(("ns", "uid-3", "c3")).claims["uid-3"]
    assert list(again.devices[0].request_names) == ["gpu"], "a repeat answers the same"


def test_a_v1beta1_kubelet_prepares_and_unprepares_the_same_way(tmp: Path) -> None:
    """Kubelets before 1.34 speak DRAPlugin v1beta1: v1 without the share ID."""
    claims, slices = Claims(), Slices()
    driver = _start(tmp, claims, slices)
    kubelet = DraKubeletStub(tmp / "plugins_registry", version="v1beta1")
    try:
        assert "v1beta1.DRAPlugin" in kubelet.register().supported_versions
        claims.add("ns", "c1", "uid-1", "gpu-1")
        answer = kubelet.prepare(("ns", "uid-1", "c1"))
        assert answer.claims["uid-1"].error == ""
        (device,) = answer.claims["uid-1"].devices
        assert (device.pool_name, device.device_name) == ("n1", "gpu-1")
        assert list(device.cdi_device_ids) == [
            f"{names.CDI_KIND_CLAIM}=uid-1-gpu-1",
            f"{names.CDI_KIND_CLAIM}=uid-1",
        ]
        assert b"share-gpu-1" not in answer.SerializeToString(), "v1beta1 has no share ID"
        assert spec_path(tmp / "cdi", "uid-1").exists()
        missing = kubelet.prepare(("ns", "uid-9", "gone")).claims["uid-9"].error
        assert "no longer exists" in missing, missing
        assert kubelet.unprepare(("ns", "uid-1", "c1")).claims["uid-1"].error == ""
        assert not spec_path(tmp / "cdi", "uid-1").exists()
    finally:
        kubelet.close()
        driver.stop()


def test_prepared_claims_survive_a_driver_restart(tmp: Path) -> None:
    claims, slices = Claims(), Slices()
    claims.add("ns", "c1", "uid-1", "gpu-0")
    driver = _start(tmp, claims, slices)
    kubelet = DraKubeletStub(tmp / "plugins_registry")
    kubelet.register()
    first = kubelet.prepare(("ns", "uid-1", "c1")).claims["uid-1"]
    kubelet.close()
    driver.stop()
    (tmp / "cdi" / "baton-claim-orphan.json").write_text("{}")
    (tmp / "cdi" / "baton-claim-uid-1.tmp").write_text('{"cdiVer')  # killed mid-write
    del claims.items[("ns", "c1")]  # the answer must now come from the record
    driver = _start(tmp, claims, slices)
    try:
        kubelet.register()
        assert not (tmp / "cdi" / "baton-claim-orphan.json").exists(), "orphans are removed"
        assert not (tmp / "cdi" / "baton-claim-uid-1.tmp").exists(), "so are torn temporaries"
        again = kubelet.prepare(("ns", "uid-1", "c1")).claims["uid-1"]
        assert again == first
        assert spec_path(tmp / "cdi", "uid-1").exists()
        kubelet.unprepare(("ns", "uid-1", "c1"))
        assert not spec_path(tmp / "cdi", "uid-1").exists()
    finally:
        kubelet.close()
        driver.stop()


def test_a_driver_cut_between_spec_and_record_leaves_nothing_prepared(tmp: Path) -> None:
    """The fake fault `/fake/hold-prepare` stops a prepare where a kill mid-prepare would: the
    spec written, the claim not recorded. The next driver removes the spec as an orphan and
    prepares the kubelet's retry from nothing."""
    claims, slices = Claims(), Slices()
    claims.add("ns", "c1", "uid-1", "gpu-0")
    # A grace on stop, so the held call is answered rather than cancelled with the server.
    graceful = dataclasses.replace(_settings(tmp), shutdown_grace=WAIT_S)
    driver = Driver(graceful, GPUS, True, slices=slices, claims=claims)
    driver.start()
    kubelet = DraKubeletStub(tmp / "plugins_registry")
    answers: list[Any] = []
    try:
        kubelet.register()
        assert post(driver, "/fake/hold-prepare", {}) == {"armed": True}
        cut = threading.Thread(
            target=lambda: answers.append(kubelet.prepare(("ns", "uid-1", "c1")))
        )
        cut.start()
        assert driver.hold is not None and driver.hold.holding.wait(WAIT_S)
        assert spec_path(tmp / "cdi", "uid-1").exists() and driver.record.get("uid-1") is None
    finally:
        driver.stop()  # gracefully: the held prepare still does not finish
        kubelet.close()
    cut.join(WAIT_S)
    assert "held (fake fault) and not finished" in answers[0].claims["uid-1"].error
    assert ClaimRecord(tmp / "state").get("uid-1") is None, "nothing recorded on disk"
    driver = _start(tmp, claims, slices)
    kubelet = DraKubeletStub(tmp / "plugins_registry")
    try:
        assert not spec_path(tmp / "cdi", "uid-1").exists(), "the orphan spec is removed at start"
        kubelet.register()
        assert kubelet.prepare(("ns", "uid-1", "c1")).claims["uid-1"].error == ""
        assert spec_path(tmp / "cdi", "uid-1").exists() and driver.record.get("uid-1") is not None
    finally:
        kubelet.close()
        driver.stop()


def test_prepare_refused_where_the_runtime_cannot_apply_cdi(tmp: Path) -> None:
    claims, slices = Claims(), Slices()
    claims.add("ns", "c1", "uid-1", "gpu-0")
    driver = _start(tmp, claims, slices, runtime_cdi="auto")
    driver._node = {"status": {"nodeInfo": {"containerRuntimeVersion": "containerd://1.6.20"}}}
    kubelet = DraKubeletStub(tmp / "plugins_registry")
    try:
        kubelet.register()
        answer = kubelet.prepare(("ns", "uid-1", "c1")).claims["uid-1"]
        assert "containerd 1.6 cannot apply CDI devices" in answer.error
        assert not spec_path(tmp / "cdi", "uid-1").exists()
    finally:
        kubelet.close()
        driver.stop()


def test_prepare_errors_per_claim(world: Any) -> None:
    driver, kubelet, claims, _ = world
    kubelet.register()
    claims.add("ns", "ok", "uid-ok", "gpu-0")
    claims.add("ns", "sick", "uid-sick", "gpu-1")
    claims.add("ns", "stale", "uid-new", "gpu-0")
    driver.health.on_xid("GPU-b", 79)
    answer = kubelet.prepare(
        ("ns", "uid-ok", "ok"),
        ("ns", "uid-sick", "sick"),
        ("ns", "uid-old", "stale"),
        ("ns", "uid-gone", "gone"),
    ).claims
    assert answer["uid-ok"].error == ""
    assert "GPU gpu-1 (GPU-b) is unhealthy (XID 79)" in answer["uid-sick"].error
    assert "it was replaced" in answer["uid-old"].error
    assert "no longer exists" in answer["uid-gone"].error


def test_a_share_consuming_more_than_its_gpu_has_is_refused_naming_both(world: Any) -> None:
    """An allocation made against a slice that no longer holds (a GPU replaced by a smaller
    one) consumes more than the device has: that claim is refused saying so, the rest of the
    batch is prepared."""
    _, kubelet, claims, _ = world
    kubelet.register()
    claims.add("ns", "ok", "uid-ok", "gpu-0")
    claims.add("ns", "big", "uid-big", "gpu-1")
    results = claims.items[("ns", "big")]["status"]["allocation"]["devices"]["results"]
    results[0]["consumedCapacity"] = {"memory": "96Gi", "duty": "30", "slots": "1"}
    answer = kubelet.prepare(("ns", "uid-ok", "ok"), ("ns", "uid-big", "big")).claims
    assert answer["uid-ok"].error == ""
    error = answer["uid-big"].error
    assert "consumes 98304 MiB of memory of gpu-1" in error and "81920 MiB" in error, error
    assert "\n" not in error
