"""Who used the GPUs: GPU-seconds held and parked byte-seconds per tenant, namespace and tier,
as Prometheus counters whose totals are kept in the state file (they survive a restart)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from baton.contract.names import METRICS_PREFIX

Key = tuple[str, str, int]
"""(tenant id, namespace, tier)."""


def namespace_of(tenant_id: str) -> str:
    """A pod tenant's namespace (`ns/name`); `local` or `llmd` for the others."""
    return tenant_id.partition("/")[0]


class Accounting:
    """Running totals; `held` on each turn's end, `parked` integrates parked bytes over time."""

    def __init__(self) -> None:
        self.gpu_seconds: dict[Key, float] = {}
        self.parked_byte_seconds: dict[Key, float] = {}
        self.by_gpu: dict[tuple[str, str], float] = {}
        """(GPU, tenant id) → seconds of turns held on that GPU (for shares of each GPU)."""
        self._last: float | None = None

    def held(self, tenant_id: str, tier: int, gpus: Sequence[str], seconds: float) -> None:
        """A turn on `gpus` held `seconds` ended."""
        key = (tenant_id, namespace_of(tenant_id), tier)
        seconds = max(0.0, seconds)
        self.gpu_seconds[key] = self.gpu_seconds.get(key, 0.0) + len(gpus) * seconds
        for gpu in gpus:
            self.by_gpu[(gpu, tenant_id)] = self.by_gpu.get((gpu, tenant_id), 0.0) + seconds

    def parked(self, now: float, parked: Mapping[str, int], tiers: Mapping[str, int]) -> bool:
        """Add each tenant's parked bytes times the time since the last call; whether any was."""
        added = False
        if self._last is not None and now > self._last:
            for tenant_id, nbytes in parked.items():
                if nbytes > 0:
                    key = (tenant_id, namespace_of(tenant_id), tiers.get(tenant_id, 0))
                    add = nbytes * (now - self._last)
                    self.parked_byte_seconds[key] = self.parked_byte_seconds.get(key, 0.0) + add
                    added = True
        self._last = now
        return added

    def to_json(self) -> dict[str, Any]:
        """For the state file."""
        return {
            "gpu_seconds": [[*k, v] for k, v in sorted(self.gpu_seconds.items())],
            "parked_byte_seconds": [[*k, v] for k, v in sorted(self.parked_byte_seconds.items())],
            "gpu_seconds_by_gpu": [[*k, v] for k, v in sorted(self.by_gpu.items())],
        }

    def load(self, data: Mapping[str, Any]) -> None:
        """Take the totals back from the state file."""
        for name in ("gpu_seconds", "parked_byte_seconds"):
            totals: dict[Key, float] = getattr(self, name)
            for tenant, ns, tier, value in data.get(name, []):
                totals[(str(tenant), str(ns), int(tier))] = float(value)
        for gpu, tenant, value in data.get("gpu_seconds_by_gpu", []):
            self.by_gpu[(str(gpu), str(tenant))] = float(value)

    def by_namespace(self) -> dict[str, float]:
        """GPU-seconds per namespace."""
        out: dict[str, float] = {}
        for (_, ns, _), value in self.gpu_seconds.items():
            out[ns] = out.get(ns, 0.0) + value
        return out


class AccountingCollector(Collector):
    """Exports the totals; `refresh` brings the parked integral up to date first."""

    def __init__(self, accounting: Accounting, refresh: Callable[[], None]) -> None:
        self._accounting, self._refresh = accounting, refresh

    def collect(self) -> Iterator[CounterMetricFamily]:
        self._refresh()
        p, labels = METRICS_PREFIX, ["tenant", "namespace", "tier"]
        held = CounterMetricFamily(
            f"{p}tenant_gpu_seconds", "GPU-seconds of turns held.", labels=labels
        )
        parked = CounterMetricFamily(
            f"{p}tenant_parked_byte_seconds",
            "Bytes parked in host DRAM, times seconds.",
            labels=labels,
        )
        for (tenant, ns, tier), value in sorted(self._accounting.gpu_seconds.items()):
            held.add_metric([tenant, ns, str(tier)], value)
        for (tenant, ns, tier), value in sorted(self._accounting.parked_byte_seconds.items()):
            parked.add_metric([tenant, ns, str(tier)], value)
        yield held
        yield parked
