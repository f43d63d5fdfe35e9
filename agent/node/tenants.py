"""Who the tenants are: local tenants registered by PID, and pods seen on this node. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from agent.core.errors import Forbidden, InvalidRegistration, RegistrationConflict
from baton.contract.names import DEPARTED

LOCAL = "local"
POD = "pod"
LLMD = "llmd"
"""A job that came through llm-d's time-slicing API (`agent.server.llmd`)."""
MAX_NAME = 253
MAX_GPUS = 64


@dataclass
class Tenant:
    """A job that takes turns on its GPUs."""

    tenant_id: str
    name: str
    gpus: tuple[str, ...]
    gpu_memory_mib: int = 0
    gpu_duty: int = 100
    memory_limit_bytes: int = 0
    priority: int = 0
    """Its tier under the `fair` policy: a pod's PriorityClass value, or a local tenant's own."""
    source: str = LOCAL
    uid: int | None = None
    """The UID that registered a local tenant; only it (or root) may add processes."""
    pids: set[int] = field(default_factory=set)
    pod_uid: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    """The pod's labels Baton reads (llm-d's `timeslice.io/*`)."""
    container_gpus: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """A pod tenant's GPUs per container, as the kubelet allocated them (`gpus` is the union)."""
    containers: dict[str, str] = field(default_factory=dict)
    """A pod tenant's container IDs (from its status) → container names."""
    parking: str = ""
    """The parking method its pod asks for (`baton.dev/parking`); empty: the node decides."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form (for the state file and /v1/status)."""
        return {
            "tenant_id": self.tenant_id,
            "name": self.name,
            "gpus": list(self.gpus),
            "gpu_memory_mib": self.gpu_memory_mib,
            "gpu_duty": self.gpu_duty,
            "memory_limit_bytes": self.memory_limit_bytes,
            "priority": self.priority,
            "source": self.source,
            "uid": self.uid,
            "pids": sorted(self.pids),
            "pod_uid": self.pod_uid,
            "labels": dict(self.labels),
            "container_gpus": {c: list(g) for c, g in sorted(self.container_gpus.items())},
            "containers": dict(sorted(self.containers.items())),
            "parking": self.parking,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Tenant:
        """Inverse of `to_json`."""
        containers = {c: tuple(g) for c, g in (data.get("container_gpus") or {}).items()}
        return cls(
            **{
                **data,
                "gpus": tuple(data["gpus"]),
                "pids": set(data.get("pids", [])),
                "container_gpus": containers,
            }
        )


def in_container(tenant: Tenant, container_id: str | None) -> Tenant:
    """The tenant as a process of one of its pod's containers sees it: that container's GPUs.

    Unchanged when the container is unknown or has no GPUs of its own recorded (an ordinary init
    container, which the kubelet does not report): then it takes turns on all the pod's GPUs.
    """
    name = tenant.containers.get(container_id or "")
    gpus = tenant.container_gpus.get(name or "")
    if not gpus or gpus == tenant.gpus:
        return tenant
    return replace(tenant, gpus=gpus)


def check_registration(
    name: str, gpus: tuple[str, ...], gpu_memory_mib: int, gpu_duty: int, memory_limit_bytes: int
) -> None:
    """Raise `InvalidRegistration` naming the first field out of range."""
    if not name.isprintable() or not 0 < len(name) <= MAX_NAME:
        raise InvalidRegistration(f"a tenant name is 1-{MAX_NAME} printable characters")
    if name == DEPARTED:
        raise InvalidRegistration(
            f"{DEPARTED} names the accounting's departed tenants; choose another name"
        )
    if not 0 < len(gpus) <= MAX_GPUS or not all(
        g.isprintable() and 0 < len(g) <= MAX_NAME for g in gpus
    ):
        raise InvalidRegistration(f"give 1-{MAX_GPUS} GPU UUIDs, each 1-{MAX_NAME} characters")
    if gpu_memory_mib < 0 or memory_limit_bytes < 0:
        raise InvalidRegistration("gpu_memory_mib and memory_limit_bytes cannot be negative")
    if not 1 <= gpu_duty <= 100:
        raise InvalidRegistration(f"gpu_duty {gpu_duty} is outside 1-100 (percent of GPU time)")


class TenantRegistry:
    """Maps processes to tenants."""

    def __init__(self) -> None:
        self.tenants: dict[str, Tenant] = {}
        self._by_pod_uid: dict[str, str] = {}
        self.revision = 0
        """Counts changes to the tenants and their processes: change them through these
        methods only (the agent's parking layer keeps what it reads of them until this moves)."""

    def register_local(
        self,
        *,
        pid: int,
        uid: int,
        name: str,
        gpus: Iterable[str],
        gpu_memory_mib: int = 0,
        gpu_duty: int = 100,
        memory_limit_bytes: int = 0,
        priority: int = 0,
    ) -> Tenant:
        """Register the process `pid` as (part of) the local tenant `name`."""
        self.revision += 1
        tenant_id = f"{LOCAL}/{name}"
        wanted = tuple(sorted(set(gpus)))
        check_registration(name, wanted, gpu_memory_mib, gpu_duty, memory_limit_bytes)
        existing = self.tenants.get(tenant_id)
        if existing is None:
            tenant = Tenant(
                tenant_id=tenant_id,
                name=name,
                gpus=wanted,
                gpu_memory_mib=gpu_memory_mib,
                gpu_duty=gpu_duty,
                memory_limit_bytes=memory_limit_bytes,
                priority=priority,
                uid=uid,
            )
            self.tenants[tenant_id] = tenant
        else:
            if existing.uid not in (uid, None) and uid != 0:
                raise Forbidden(f"tenant {name!r} was registered by UID {existing.uid}, not {uid}")
            if existing.gpus != wanted:
                raise RegistrationConflict(
                    f"tenant {name!r} is registered with GPUs {', '.join(existing.gpus)}; "
                    "use another name for other GPUs"
                )
            tenant = existing
        tenant.pids.add(pid)
        return tenant

    def upsert_pod(self, tenant: Tenant) -> None:
        """A pod on this node with Baton GPUs (or another kept tenant), added or changed."""
        self.revision += 1
        old = self.tenants.get(tenant.tenant_id)
        if old is not None:
            tenant.pids = old.pids
        self.tenants[tenant.tenant_id] = tenant
        if tenant.pod_uid:
            self._by_pod_uid[tenant.pod_uid] = tenant.tenant_id

    def remove(self, tenant_id: str) -> Tenant | None:
        """Forget a tenant."""
        self.revision += 1
        tenant = self.tenants.pop(tenant_id, None)
        if tenant is not None:
            self._by_pod_uid.pop(tenant.pod_uid, None)
        return tenant

    def drop_pid(self, tenant_id: str, pid: int) -> bool:
        """A process of the tenant ended; whether it was one of the tenant's (the tenant is
        then journaled again)."""
        tenant = self.tenants.get(tenant_id)
        if tenant is None or pid not in tenant.pids:
            return False
        self.revision += 1
        tenant.pids.discard(pid)
        return True

    def add_pids(self, tenant: Tenant, pids: Iterable[int]) -> bool:
        """Processes of the tenant found by other means than a registration (llm-d's calls);
        whether any was new (the tenant is then journaled again)."""
        new = set(pids) - tenant.pids
        if new:
            self.revision += 1
            tenant.pids.update(new)
        return bool(new)

    def find(self, pid: int, pod_uid: str | None, uid: int | None = None) -> Tenant | None:
        """The tenant a process belongs to: its pod if it runs in one, else its registration
        (the process `uid` being the registering user's, or root: a PID a tenant's process left
        behind, given to another user's process, is not the tenant's)."""
        if pod_uid:
            tenant_id = self._by_pod_uid.get(pod_uid)
            return None if tenant_id is None else self.tenants.get(tenant_id)
        for tenant in self.tenants.values():
            mine = uid in (None, 0) or tenant.uid in (None, uid)
            if tenant.source == LOCAL and pid in tenant.pids and mine:
                return tenant
        return None

    def per_gpu(self) -> dict[str, int]:
        """How many tenants are registered on each GPU."""
        counts: dict[str, int] = {}
        for tenant in self.tenants.values():
            for gpu in tenant.gpus:
                counts[gpu] = counts.get(gpu, 0) + 1
        return counts

    def restore(self, tenants: Iterable[Tenant]) -> None:
        """Reinstate tenants loaded from the state file."""
        self.revision += 1
        for tenant in tenants:
            self.tenants[tenant.tenant_id] = tenant
            if tenant.pod_uid:
                self._by_pod_uid[tenant.pod_uid] = tenant.tenant_id
