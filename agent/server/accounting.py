"""Who used the GPUs: GPU-seconds held and parked byte-seconds per tenant, namespace and tier,
as Prometheus counters whose totals are kept in the state file (they survive a restart).

A tenant gone from the node for long enough is folded into its namespace's pseudo-tenant
`<namespace>/(departed)` (`Accounting.fold`): the totals keep its time, while /metrics and the
state file stop growing with every short-lived pod. Pseudo-tenants are not exported: a departed
tenant's series end, and no series jumps by what was folded into it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from baton.contract.names import METRICS_PREFIX, departed_tenant, is_departed_tenant

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
        self.departed: dict[str, float] = {}
        """Tenant id → when it left the node (wall clock), until it is folded or comes back."""
        self._last: float | None = None
        self._reading: dict[Key, int] = {}
        """What each tenant had parked at the last `parked`: what it holds parked until the next."""

    def held(self, tenant_id: str, tier: int, gpus: Sequence[str], seconds: float) -> None:
        """A turn on `gpus` held `seconds` ended."""
        key = (tenant_id, namespace_of(tenant_id), tier)
        seconds = max(0.0, seconds)
        self.gpu_seconds[key] = self.gpu_seconds.get(key, 0.0) + len(gpus) * seconds
        for gpu in gpus:
            self.by_gpu[(gpu, tenant_id)] = self.by_gpu.get((gpu, tenant_id), 0.0) + seconds

    def parked(self, now: float, parked: Mapping[str, int], tiers: Mapping[str, int]) -> bool:
        """What is parked `now`: add what each tenant had parked at the last call times the time
        since, then count `parked` from now on; whether anything was added. Called whenever
        what is parked changes (and before the totals are read), it integrates exactly."""
        added = False
        if self._last is not None and now > self._last:
            for key, nbytes in self._reading.items():
                add = nbytes * (now - self._last)
                self.parked_byte_seconds[key] = self.parked_byte_seconds.get(key, 0.0) + add
                added = True
        self._reading = {
            (tenant_id, namespace_of(tenant_id), tiers.get(tenant_id, 0)): nbytes
            for tenant_id, nbytes in parked.items()
            if nbytes > 0
        }
        self._last = now
        return added

    def left(self, tenant_id: str, at: float) -> None:
        """The tenant left the node at `at` (wall clock); a second word of it changes nothing."""
        if not is_departed_tenant(tenant_id):
            self.departed.setdefault(tenant_id, at)

    def returned(self, tenant_id: str) -> bool:
        """The tenant is on the node again (a pod recreated under its name, a reconnect);
        whether it had left."""
        return self.departed.pop(tenant_id, None) is not None

    def fold(self, now: float, after: float) -> bool:
        """Fold the tenants gone for `after` seconds or more (none if `after` is 0) into their
        namespace's pseudo-tenant, per tier and per GPU; whether any was folded (not one
        that has memory parked: its row would grow again)."""
        parking = {key[0] for key in self._reading}
        gone = {
            tenant_id
            for tenant_id, at in self.departed.items()
            if after > 0 and now - at >= after and tenant_id not in parking
        }
        if not gone:
            return False
        for totals in (self.gpu_seconds, self.parked_byte_seconds):
            for key in [k for k in totals if k[0] in gone]:
                into = (departed_tenant(key[1]), key[1], key[2])
                totals[into] = totals.get(into, 0.0) + totals.pop(key)
        for gpu, tenant_id in [k for k in self.by_gpu if k[1] in gone]:
            into_gpu = (gpu, departed_tenant(namespace_of(tenant_id)))
            self.by_gpu[into_gpu] = self.by_gpu.get(into_gpu, 0.0) + self.by_gpu.pop(
                (gpu, tenant_id)
            )
        for tenant_id in gone:
            del self.departed[tenant_id]
        return True

    def mark_unknown_departed(self, known: set[str], at: float) -> None:
        """Count every tenant with totals that is not among `known` (the tenants an agent
        restart brings back) and not yet counted departed as departed `at`: the state of a
        crash, or of an agent that did not keep departure times, is forgotten in time too."""
        for tenant_id, _, _ in [*self.gpu_seconds, *self.parked_byte_seconds]:
            if tenant_id not in known and tenant_id not in self.departed:
                self.left(tenant_id, at)

    def to_json(self) -> dict[str, Any]:
        """For the state file."""
        return {
            "gpu_seconds": [[*k, v] for k, v in sorted(self.gpu_seconds.items())],
            "parked_byte_seconds": [[*k, v] for k, v in sorted(self.parked_byte_seconds.items())],
            "gpu_seconds_by_gpu": [[*k, v] for k, v in sorted(self.by_gpu.items())],
            "departed": [[t, at] for t, at in sorted(self.departed.items())],
        }

    def load(self, data: Mapping[str, Any]) -> None:
        """Take the totals back from the state file."""
        for name in ("gpu_seconds", "parked_byte_seconds"):
            totals: dict[Key, float] = getattr(self, name)
            for tenant, ns, tier, value in data.get(name, []):
                totals[(str(tenant), str(ns), int(tier))] = float(value)
        for gpu, tenant, value in data.get("gpu_seconds_by_gpu", []):
            self.by_gpu[(str(gpu), str(tenant))] = float(value)
        for tenant, at in data.get("departed", []):
            self.departed[str(tenant)] = float(at)

    def by_namespace(self) -> dict[str, float]:
        """GPU-seconds per namespace."""
        out: dict[str, float] = {}
        for (_, ns, _), value in self.gpu_seconds.items():
            out[ns] = out.get(ns, 0.0) + value
        return out


class AccountingCollector(Collector):
    """Exports the totals, but not the pseudo-tenants of departed ones; `refresh` brings the
    parked integral up to date (and folds) first."""

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
        for family, totals in (
            (held, self._accounting.gpu_seconds),
            (parked, self._accounting.parked_byte_seconds),
        ):
            for (tenant, ns, tier), value in sorted(totals.items()):
                if not is_departed_tenant(tenant):
                    family.add_metric([tenant, ns, str(tier)], value)
        yield held
        yield parked
