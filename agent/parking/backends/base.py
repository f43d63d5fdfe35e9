"""The interface every evacuation backend implements.

The lease service never moves memory itself. Before it grants a turn it asks the residency
layer to make room, and the residency layer drives a `Backend` to park and restore tenants.
Backend calls may block (they copy memory); the agent runs them off its event loop.
"""

from __future__ import annotations

import abc
from collections.abc import Collection
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Residency(StrEnum):
    """Where a tenant's memory on one GPU is."""

    RESIDENT = "resident"
    PARKED = "parked"
    PARKING = "parking"
    RESTORING = "restoring"


@dataclass(frozen=True)
class TenantRef:
    """What a backend needs to know about a tenant to move its memory."""

    tenant_id: str
    gpus: tuple[str, ...]
    pids: tuple[int, ...] = ()
    """Host PIDs of the tenant's GPU processes (cuda backend)."""
    memory_limit_bytes: int | None = None
    """The tenant's memory cgroup limit, if known; parked bytes are charged to it."""
    pod_uid: str = ""
    """The tenant's pod, if it is one: its GPU processes are found by cgroup."""
    declared_bytes: int | None = None
    """Device memory per GPU the tenant declared (`baton.dev/gpu-memory`), if it did."""
    parking: str = ""
    """The parking method its pod asks for (`baton.dev/parking`); empty: the node decides."""
    self_parks: bool = False
    """Whether a session of the tenant offers park/restore callbacks (it parks itself)."""


@dataclass(frozen=True)
class Move:
    """The outcome of one park or restore."""

    tenant_id: str
    gpu: str
    direction: str  # "park" | "restore"
    bytes: int
    seconds: float


@dataclass
class TenantState:
    """A backend's view of one tenant, for /v1/status."""

    tenant_id: str
    residency: dict[str, Residency] = field(default_factory=dict)
    footprint_bytes: dict[str, int] = field(default_factory=dict)
    parked_bytes: int = 0
    detail: str = ""
    quarantined: str = ""
    """Why the tenant may take no more turns (its processes are in a state the agent cannot fix)."""
    unparkable: str = ""
    """Why the tenant cannot be parked (it stays resident); empty if it can be."""
    pids: tuple[int, ...] = ()
    """The processes the backend moves for it, if it moves processes (cuda)."""
    method: str = ""
    """The parking method that moves it (one of `agent.parking.methods.METHODS`); empty: the
    backend's own."""


class BackendError(Exception):
    """A park or restore failed; the tenant is left as `state()` reports it."""


class BackendQuarantined(BackendError):
    """The tenant's processes are in a state the agent cannot fix; it takes no more turns."""


class Unparkable(BackendError):
    """The driver cannot park this tenant (the message says why); it stays resident."""


class RecordError(ValueError):
    """A saved parking record (`durable`'s, read back at start) of another shape; the message
    names the field."""


class BackendUnavailable(Exception):
    """The backend cannot run here (missing package or driver); the message says what to do."""


def move_deadline(base_s: float, nbytes: int, copy_gbps: float) -> float:
    """Seconds a move of `nbytes` may take: `base_s`, and the bytes at the slowest copy rate
    allowed for (`--slowest-copy-gbps`), so that a large tenant's park is not cut short."""
    return base_s + nbytes / (copy_gbps * 1e9)


class Backend(abc.ABC):
    """Parks and restores tenants' GPU memory. Implementations: one per parking method of
    `agent.parking.methods.METHODS` but `none`, its `name` the method's, and
    `agent.parking.multi.MultiBackend`, which routes each tenant to one of several."""

    name: str = "base"
    reads_block: bool = True
    """Whether `state`, `memory_limit` and `memory_used` may block (driver calls, files): the
    preparer then reads in a worker thread. False: they read the backend's own memory."""

    @abc.abstractmethod
    def attach(self, tenant: TenantRef) -> None:
        """A tenant appeared (registered, or its pod was seen on this node)."""

    @abc.abstractmethod
    def detach(self, tenant_id: str) -> None:
        """A tenant is gone for good: release whatever is held for it (parked bytes included)."""

    @abc.abstractmethod
    def footprint(self, tenant_id: str, gpu: str) -> int:
        """Bytes of device memory the tenant occupies (or would occupy) on `gpu`."""

    @abc.abstractmethod
    def park(self, tenant_id: str, gpu: str) -> Move:
        """Move the tenant's memory on `gpu` to host DRAM and free the device memory."""

    @abc.abstractmethod
    def restore(self, tenant_id: str, gpu: str) -> Move:
        """Bring the tenant's parked memory on `gpu` back to the device."""

    @abc.abstractmethod
    def state(self, tenant_id: str) -> TenantState:
        """Where the tenant's memory is now."""

    def tenants(self) -> list[str]:
        """Tenants this backend holds memory for, including ones found again after a restart."""
        return []

    def moves_on_loop(self, tenant_id: str) -> bool:
        """Whether the tenant's moves are calls the agent awaits on its own event loop
        (`move_on_loop`) rather than blocking work for a worker thread."""
        return False

    async def move_on_loop(self, tenant_id: str, gpu: str, direction: str) -> Move:
        """Park (`direction` "park") or restore the tenant on `gpu`, on the event loop."""
        raise NotImplementedError(f"{self.name} moves in a worker thread")

    def hand_restore(self, tenant_id: str, gpu: str) -> Move | None:
        """Leave the tenant's restore on `gpu` to the tenant itself, which runs it as its grant
        arrives, before it uses the GPU (a client that asked to, `restores_with_grant`): count
        it resident from now. None where this backend restores its tenants itself, as one whose
        moves run in a worker thread does (a plan makes those with the moves beside them)."""
        return None

    def not_restored(self, tenant_id: str, gpu: str) -> None:
        """A restore left to the tenant (`hand_restore`) did not happen: what its last park on
        `gpu` moved is in host memory still; count it parked again. Nothing to do where this
        backend restores its tenants itself (it never hands a restore)."""
        return None

    def parks_itself(self, tenant_id: str) -> bool:
        """Whether the tenant's own process moves its memory (its callbacks), so that it can
        park itself as it yields (`self_parked`)."""
        return False

    def self_parked(self, tenant_id: str, gpu: str, moved: int) -> Move | None:
        """The tenant's process parked its memory on `gpu` itself as its turn ended (`moved`
        bytes, its word, as a park callback's answer is): count it parked. None where this
        backend moves its tenants itself."""
        return None

    def asleep_on(self, gpus: Collection[str]) -> list[str]:
        """Tenants counted parked on one of `gpus` whose processes may hold their memory again
        without the agent (an engine restarted awake) and can say so (`awake_again`); read from
        the backend's own memory: no wait."""
        return []

    def awake_again(self, tenant_id: str) -> bool:
        """Ask the tenant's processes whether they hold its parked memory on the device again
        (a call: it blocks); if one says so, count the tenant resident from now and return
        True. False where they are parked, or do not say."""
        return False

    def methods(self) -> tuple[str, ...]:
        """The parking methods this backend offers (one, unless it routes between several)."""
        return (self.name,)

    def method_of(self, tenant_id: str) -> str:
        """The method that moves the tenant's memory."""
        return self.name

    def method_for(self, ref: TenantRef) -> str:
        """The method that moves the tenant `ref` describes, attached or not (for events)."""
        return self.name

    def pin(self, tenant_id: str, method: str) -> None:  # noqa: B027 - optional hook
        """Move the tenant by `method` (one of `methods`) until it is resident again (llm-d's
        BackendConfig); with one method it is moved by that one already."""

    def backend_for(self, method: str) -> Backend:
        """The backend that moves tenants by `method` (one of `methods`): this one, unless it
        routes between several."""
        if method not in self.methods():
            raise KeyError(method)
        return self

    def memory_limit(self, tenant_id: str) -> int | None:
        """The tenant's memory cgroup limit in bytes, if the backend can tell."""
        return None

    def memory_used(self, tenant_id: str) -> int:
        """Bytes its memory cgroup (the one `memory_limit` names) uses already."""
        return 0

    def rescan(self, tenant_id: str) -> None:  # noqa: B027 - optional hook
        """The tenant's processes may have changed (a session opened): find them again."""

    def durable(self) -> dict[str, Any]:
        """What must survive an agent restart (JSON): e.g. which processes are parked."""
        return {}

    def adopt(self, saved: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Take back what `durable` returned before a restart; confirmed before it is used."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release backend resources at agent shutdown (parked tenant memory is kept)."""
