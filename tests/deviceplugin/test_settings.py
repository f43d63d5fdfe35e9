"""Parsing what the operator gives: fake GPU declarations, the DRAM budget, ignored XIDs."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.parking.setup import parse_fake_gpus as agent_fake_gpus
from baton.contract.names import fake_gpu_uuid
from nodegpu.annotate import host_memory_budget_mib
from nodegpu.gpus import DiscoveryError, discover, parse_fake_gpus
from nodegpu.health import DEFAULT_IGNORED_XIDS, is_critical_xid, parse_xid_list

MEMINFO = "MemTotal:       16384000 kB\nMemFree:         1000 kB\n"


def test_fake_gpus_from_count_and_memory_have_stable_uuids():
    gpus = parse_fake_gpus("2x81920", "node-a")
    assert [(g.index, g.memory_mib) for g in gpus] == [(0, 81920), (1, 81920)]
    assert [g.uuid for g in gpus] == [fake_gpu_uuid(0, "node-a"), fake_gpu_uuid(1, "node-a")]
    assert gpus[0].uuid == "GPU-fake-node-a-0000"
    assert parse_fake_gpus("2x81920", "node-a") == gpus
    assert parse_fake_gpus("2x81920", "node-b")[0].uuid != gpus[0].uuid
    assert [g.memory_mib for g in parse_fake_gpus("100,50", "node-a")] == [100, 50]


def test_the_agent_names_a_nodes_fake_gpus_as_the_device_plugin_does():
    for spec in ("2x81920", "24576,81920"):
        plugin = {g.uuid: g.memory_mib * 1024 * 1024 for g in parse_fake_gpus(spec, "node-a")}
        assert agent_fake_gpus(spec, "node-a") == plugin


def test_fake_gpus_from_a_file(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text("- {memoryMiB: 24576, model: L4}\n- {memoryMiB: 81920, uuid: GPU-fixed}\n")
    gpus = parse_fake_gpus(str(path), "node-a")
    assert [(g.uuid, g.model, g.memory_mib) for g in gpus] == [
        (fake_gpu_uuid(0, "node-a"), "L4", 24576),
        ("GPU-fixed", "Baton Fake GPU", 81920),
    ]


@pytest.mark.parametrize("spec", ["0x100", "two", "1,,2", "/nonexistent/gpus.yaml"])
def test_bad_fake_gpu_declarations_are_refused(spec):
    with pytest.raises(DiscoveryError):
        parse_fake_gpus(spec, "node-a")


@pytest.mark.parametrize("spec", ["65x1024", "1000000x81920", ",".join(["1024"] * 65), "file"])
def test_more_fake_gpus_than_one_node_publishes_are_refused_naming_the_flag(spec, tmp_path):
    """The DRA driver's ResourceSlice holds at most 64 devices once one is tainted, so past 64
    it could never say a GPU went unhealthy; and a count typo (`100000000000x1`) filled the
    memory building its list, with nothing said."""
    if spec == "file":
        spec = str(tmp_path / "gpus.yaml")
        Path(spec).write_text("- {memoryMiB: 1024}\n" * 65)
    with pytest.raises(DiscoveryError) as refused:
        parse_fake_gpus(spec, "node-a")
    assert str(refused.value).startswith("--fake-gpus ") and "at most 64" in str(refused.value)
    if not spec.endswith(".yaml"):
        with pytest.raises(ValueError, match="at most 64"):
            agent_fake_gpus(spec, "node-a")
    assert len(parse_fake_gpus("64x1024", "node-a")) == 64


def test_no_gpu_and_no_flag_names_both():
    try:
        discover(None, "node-a")
    except DiscoveryError as err:
        assert "no NVIDIA GPU found" in str(err) and "--fake-gpus" in str(err)
    else:
        pytest.skip("this machine has an NVIDIA GPU")


@pytest.mark.parametrize(
    ("spec", "mib"), [("65536", 65536), ("50%", 8000), ("100%", 16000), ("12.5%", 2000)]
)
def test_host_memory_budget(spec, mib):
    assert host_memory_budget_mib(spec, MEMINFO) == mib


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("lots", "give MiB (65536) or a share (50%)"),
        ("0%", "the share must be within (0, 100]%"),
        ("150%", "the share must be within (0, 100]%"),
        ("-5", "MiB must be 0 or more"),
        ("half%", "give MiB (65536) or a share (50%)"),
        ("%", "give MiB (65536) or a share (50%)"),
    ],
)
def test_bad_host_memory_budget_is_refused_naming_the_flag(spec, says):
    with pytest.raises(ValueError) as caught:
        host_memory_budget_mib(spec, MEMINFO)
    assert str(caught.value) == f"--host-memory-budget {spec!r}: {says}"


def test_ignored_xids():
    ignored = parse_xid_list("13, 31,43")
    assert ignored == {13, 31, 43}
    assert not is_critical_xid(13, ignored) and is_critical_xid(79, ignored)
    assert parse_xid_list("") == frozenset()
    assert 79 not in DEFAULT_IGNORED_XIDS
    with pytest.raises(ValueError, match="comma-separated integers"):
        parse_xid_list("13,x")
