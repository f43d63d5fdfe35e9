"""`baton bench schedule` against the real kube-apiserver and kube-scheduler (small sizes)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from baton.contract.kube import Outage
from baton.contract.names import ANNOTATION_ASSIGNED_GPUS
from baton.contract.quantity import parse_quantity
from baton.contract.reflector import KubeSource, Reflector, WatchEvent
from commands.bench import nullextender, schedprofiles, schedule
from commands.localnode.binaries import find_binaries

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", autouse=True)
def binaries() -> None:
    if find_binaries() is None:
        pytest.skip("needs Kubernetes binaries (BATON_KUBE_BIN_DIR, or ../shared/k8s)")


def test_both_profiles_schedule_every_pod_and_report_same_run_figures() -> None:
    figures = schedule.run(nodes=3, pods_count=30, latency_pods=6, rate=20.0, rounds=2)
    assert figures["pods"] == 30 and figures["nodes"] == 3 and figures["rounds"] == 2
    assert figures["pods_per_s"] > 0 and figures["reference_pods_per_s"] > 0
    ratio = figures["pods_per_s"] / figures["reference_pods_per_s"]
    assert figures["throughput_ratio"] == pytest.approx(ratio, rel=0.01)
    for key in ("pods_per_s", "reference_pods_per_s"):
        rounds = figures[f"{key}_rounds"]
        assert len(rounds) == 2 and all(r > 0 for r in rounds)
        assert figures[key] == pytest.approx(sum(rounds) / 2, rel=0.01)  # the median of two
    assert figures["steady_pods_per_s"] > 0 and figures["reference_steady_pods_per_s"] > 0
    assert 0 < figures["p50_schedule_ms"] <= figures["p99_schedule_ms"]
    assert 0 < figures["reference_p50_schedule_ms"] <= figures["reference_p99_schedule_ms"]
    for key in ("refused_requests_rounds", "reference_refused_requests_rounds"):
        assert len(figures[key]) == 2 and all(n >= 0 for n in figures[key])


def test_the_extender_profile_really_goes_through_the_extender(tmp_path: Path) -> None:
    """Pods of the Baton profile carry the extender's GPU assignment; the reference's do not."""
    bench = schedule.Bench(tmp_path, nodes=2)
    with bench.running():
        for profile in (schedule.SCHEDULER_NAME, schedule.REFERENCE):
            watch = schedule.fleet.BindWatch(bench.api, schedule.NAMESPACE).start()
            try:
                pods = schedule.pods(profile, f"{profile}-x", 4)
                schedule.fleet.create_pods(bench.api, schedule.NAMESPACE, pods)
                with bench.scheduler(profile):
                    watch.wait_bound((p["metadata"]["name"] for p in pods), 120)
            finally:
                watch.stop()
            listed = bench.api.list_namespaced_pod(
                schedule.NAMESPACE, label_selector=f"{schedule.fleet.BENCH_LABEL}={profile}"
            ).items
            assert len(listed) == 4
            for p in listed:  # V1Pod: its metadata and spec are always there
                assert p.metadata is not None and p.spec is not None
                gpus = (p.metadata.annotations or {}).get(ANNOTATION_ASSIGNED_GPUS)
                if profile == schedule.SCHEDULER_NAME:
                    assert gpus and gpus.startswith(f"GPU-{p.spec.node_name}-")
                else:
                    assert gpus is None


def test_the_command_prints_json_last_or_says_what_is_missing() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "baton",
            "bench",
            "schedule",
            "--nodes",
            "2",
            "--pods",
            "8",
            "--latency-pods",
            "2",
            "--rounds",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["pods"] == 8 and figures["reference_pods_per_s"] > 0


def test_refused_requests_are_counted_from_the_429_series_only() -> None:
    metrics = "\n".join(
        [
            "# HELP apiserver_request_total Counter of apiserver requests",
            'apiserver_request_total{code="201",verb="POST",resource="pods"} 1000',
            'apiserver_request_total{code="429",verb="POST",resource="pods"} 120',
            'apiserver_request_total{code="429",verb="POST",resource="events"} 94',
            'apiserver_request_duration_seconds_count{code="429"} 7',
        ]
    )
    assert schedule.refused_in(metrics) == 214


def test_the_dra_path_reports_its_profile_beside_dra_alone_the_extender_and_the_reference() -> None:
    figures = schedule.run(nodes=2, pods_count=12, latency_pods=2, rate=20.0, rounds=1, path="dra")
    assert figures["path"] == "dra" and figures["pods"] == 12
    for prefix in ("", "dra_", "dra_alone_", "dra_null_", "reference_"):
        assert figures[f"{prefix}pods_per_s"] > 0
        assert len(figures[f"{prefix}pods_per_s_rounds"]) == 1
        assert 0 < figures[f"{prefix}p50_schedule_ms"] <= figures[f"{prefix}p99_schedule_ms"]
    ratio = figures["dra_pods_per_s"] / figures["reference_pods_per_s"]
    assert figures["dra_throughput_ratio"] == pytest.approx(ratio, rel=0.01)
    alone = figures["dra_pods_per_s"] / figures["dra_alone_pods_per_s"]
    assert figures["dra_vs_dra_alone_ratio"] == pytest.approx(alone, rel=0.01)
    null = figures["dra_pods_per_s"] / figures["dra_null_pods_per_s"]
    assert figures["dra_vs_dra_null_ratio"] == pytest.approx(null, rel=0.01)
    null_alone = figures["dra_null_pods_per_s"] / figures["dra_alone_pods_per_s"]
    assert figures["dra_null_vs_dra_alone_ratio"] == pytest.approx(null_alone, rel=0.01)


def test_the_null_extender_passes_every_node_and_scores_none() -> None:
    body = json.dumps({"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["a", "b"]}).encode()
    assert json.loads(nullextender.answer(b"/filter", body)) == {
        "NodeNames": ["a", "b"],
        "FailedNodes": {},
        "Error": "",
    }
    assert json.loads(nullextender.answer(b"/prioritize", body)) == [
        {"Host": "a", "Score": 0},
        {"Host": "b", "Score": 0},
    ]


def test_the_dra_null_profile_calls_the_null_extender_for_filter_and_prioritize() -> None:
    config = schedule.scheduler_config(Path("kubeconfig"), schedule.DRA_NULL, "http://null")
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "http://null" and "bindVerb" not in extender
    assert (extender["filterVerb"], extender["prioritizeVerb"]) == ("filter", "prioritize")
    assert config["profiles"][0]["schedulerName"] == schedule.DRA_NULL


def test_dra_alone_is_the_dra_overlays_profile_without_the_extender(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    alone = schedule.scheduler_config(kubeconfig, schedule.DRA_ALONE, None)
    with_baton = schedule.scheduler_config(kubeconfig, schedule.DRA, "http://127.0.0.1:1")
    assert "extenders" not in alone and with_baton["extenders"]
    assert alone["profiles"][0]["schedulerName"] == schedule.DRA_ALONE
    assert with_baton["profiles"][0]["schedulerName"] == schedule.DRA
    del alone["profiles"][0]["schedulerName"], with_baton["profiles"][0]["schedulerName"]
    assert alone["profiles"] == with_baton["profiles"]


def test_the_dra_profile_allocates_each_pods_claim_from_its_nodes_slice(tmp_path: Path) -> None:
    """Claims get a share of a GPU on their pod's node (no kubelet: the scheduler reads the
    slices from the API) with the memory and duty asked; the bench removes them afterwards."""
    bench = schedule.Bench(tmp_path, nodes=2, path="dra")
    with bench.running():
        watch = schedule.fleet.BindWatch(bench.api, schedule.NAMESPACE).start()
        try:
            pods = bench.pods(schedule.DRA, "dra-x", 6)
            schedule.fleet.create_pods(bench.api, schedule.NAMESPACE, pods)
            with bench.scheduler(schedule.DRA):
                watch.wait_bound((p["metadata"]["name"] for p in pods), 120)
        finally:
            watch.stop()
        nodes = {
            p.metadata.name: p.spec.node_name
            for p in bench.api.list_namespaced_pod(schedule.NAMESPACE).items
            if p.metadata is not None and p.spec is not None
        }
        claims = listed_claims(bench)
        assert len(claims) == 6
        for index, claim in enumerate(sorted(claims, key=lambda c: c["metadata"]["name"])):
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert result["pool"] == nodes[claim["metadata"]["name"]]
            assert result["device"].startswith("gpu-")
            consumed = result["consumedCapacity"]
            mib = schedprofiles.MEMORY_SHAPES[index % 3]
            assert parse_quantity(consumed["memory"]) == mib * 1024 * 1024
            assert parse_quantity(consumed["duty"]) == schedprofiles.DUTY_SHAPES[index % 3]
        bench.clear(schedule.DRA)
        assert listed_claims(bench) == []


def listed_claims(bench: schedule.Bench) -> list[dict[str, Any]]:
    """The bench namespace's ResourceClaims as the API lists them."""
    drafleet = schedule.drafleet
    listed = bench.custom.list_namespaced_custom_object(
        drafleet.GROUP, drafleet.VERSION, schedule.NAMESPACE, "resourceclaims"
    )
    assert isinstance(listed, dict)
    return list(listed["items"])


def test_the_dra_profile_is_the_dra_overlays_and_an_unknown_path_is_refused() -> None:
    config = schedule.scheduler_config(Path("kubeconfig"), schedule.DRA, "http://x")
    assert [p["schedulerName"] for p in config["profiles"]] == [schedule.DRA]
    assert config["leaderElection"] == {"leaderElect": False}
    with pytest.raises(ValueError, match="path must be one of"):
        schedule.Bench(Path("unused"), nodes=1, path="kubelet")


class Names:
    """Object names a reflector holds, with a condition to wait on."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.changed = threading.Condition()

    def replace(self, objects: list[dict[str, Any]], resource_version: str) -> None:
        with self.changed:
            self.names = {o["metadata"]["name"] for o in objects}
            self.changed.notify_all()

    def apply(self, event: WatchEvent) -> None:
        with self.changed:
            name = event.object["metadata"]["name"]
            (self.names.discard if event.type == "DELETED" else self.names.add)(name)
            self.changed.notify_all()

    def wait(self, names: set[str]) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.names == names, 30.0), self.names


def test_the_reflector_lists_and_watches_resourceslices_and_resourceclaims(
    tmp_path: Path,
) -> None:
    """The contract's reflector on DRA's kinds against the real kube-apiserver (raw JSON)."""
    bench = schedule.Bench(tmp_path, nodes=2, path="dra")
    with bench.running():
        api_client = bench.api.api_client
        outage = Outage(logging.getLogger("test.dra"), "watch of DRA objects", "nothing")
        slices, claims = Names(), Names()
        sources = [
            Reflector(KubeSource(api_client, "resourceslices"), slices, outage, name="slices"),
            Reflector(
                KubeSource(api_client, "resourceclaims", namespace=schedule.NAMESPACE),
                claims,
                outage,
                name="claims",
            ),
        ]
        for reflector in sources:
            reflector.start()
        try:
            slices.wait({f"bench-node-{i:04d}-gpu.baton.dev" for i in range(2)})
            claims.wait(set())
            bench.pods(schedule.DRA, "seen", 3)  # makes the claims
            claims.wait({f"seen-{i:05d}" for i in range(3)})
            bench.clear(schedule.DRA)
            claims.wait(set())
        finally:
            for reflector in sources:
                assert reflector.stop()
