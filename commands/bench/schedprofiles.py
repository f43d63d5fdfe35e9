"""The scheduler profiles `baton bench schedule` compares, and the pods and claims it gives them.

The reference profile is kube-scheduler without Baton; the extender profile is the project's
`baton-scheduler` (`manifests/scheduler/scheduler-config.yaml`); with `--path dra`, the DRA
overlay's profile with its extender (`DRA`), with an extender that decides nothing (`DRA_NULL`,
`commands.bench.nullextender`: what two round trips per pod cost), and without one (`DRA_ALONE`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from baton.contract.names import RESOURCE_GPU_DUTY, RESOURCE_GPU_MEMORY
from commands.bench import drafleet, fleet

REFERENCE = "baton-bench-reference"
DRA = "baton-bench-dra"
DRA_ALONE = "baton-bench-dra-alone"
DRA_NULL = "baton-bench-dra-null"
DRA_PROFILES = (DRA, DRA_ALONE, DRA_NULL)
PATHS = ("extender", "dra")
MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
CONFIG = MANIFESTS / "scheduler" / "scheduler-config.yaml"
DRA_CONFIG = MANIFESTS / "overlays" / "dra" / "scheduler" / "config.yaml"
CLIENT_QPS = 5000
BIND_TIMEOUT_S = 300.0
MEMORY_SHAPES = (8192, 16384, 24576)
DUTY_SHAPES = (10, 20, 25)


def scheduler_config(kubeconfig: Path, profile: str, extender_url: str | None) -> dict[str, Any]:
    """The project's `baton-scheduler` configuration, the DRA overlay's (as `profile`; without
    its extender for `DRA_ALONE`), or the reference profile without Baton."""
    source = DRA_CONFIG if profile in DRA_PROFILES else CONFIG
    config: dict[str, Any] = yaml.safe_load(source.read_text())
    config["leaderElection"] = {"leaderElect": False}
    config["clientConnection"] = {
        "kubeconfig": str(kubeconfig),
        "qps": CLIENT_QPS,
        "burst": CLIENT_QPS,
    }
    if profile in DRA_PROFILES:
        config["profiles"][0]["schedulerName"] = profile
    if profile == DRA_ALONE:
        config.pop("extenders", None)
        return config
    if extender_url is not None:
        for extender in config.get("extenders", []):
            extender["urlPrefix"] = extender_url
    if profile != REFERENCE:
        return config
    ignored = [RESOURCE_GPU_MEMORY, RESOURCE_GPU_DUTY]
    fit = {"name": "NodeResourcesFit", "args": {"ignoredResources": ignored}}
    config.pop("extenders")
    config["profiles"] = [{"schedulerName": profile, "pluginConfig": [fit]}]
    return config


def pods(scheduler: str, prefix: str, count: int) -> list[dict[str, Any]]:
    """`count` tenant pods of mixed memory and duty, the same shapes for every profile (on
    the DRA profiles each names its claim, `claims` makes them)."""
    if scheduler in DRA_PROFILES:
        return [drafleet.pod_body(name, scheduler, name) for name, _, _ in _tenants(prefix, count)]
    return [fleet.pod_body(name, scheduler, *shape) for name, *shape in _tenants(prefix, count)]


def claims(prefix: str, count: int, profile: str = DRA) -> list[dict[str, Any]]:
    """The claims of a DRA profile's `pods(profile, prefix, count)`, one each, same shapes."""
    return [drafleet.claim_body(name, profile, *shape) for name, *shape in _tenants(prefix, count)]


def _tenants(prefix: str, count: int) -> Iterator[tuple[str, int, int]]:
    """Each tenant's name, memory (MiB) and duty (percent), the same for every profile."""
    for i in range(count):
        memory, duty = MEMORY_SHAPES[i % len(MEMORY_SHAPES)], DUTY_SHAPES[i % len(DUTY_SHAPES)]
        yield f"{prefix}-{i:05d}", memory, duty
