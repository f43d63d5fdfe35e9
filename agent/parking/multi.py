"""Several parking methods on one node: each tenant's moves go to the method that parks it.

A tenant parks by the method its pod asks for (`baton.dev/parking`), else by its own callbacks
(`app`: the method `agent.parking.methods` marks `self_parks`) when its session offers them,
else by the node's default (the first method listed). A tenant keeps its method while any of its
memory is parked, so a restore always goes to the method that parked it. Moves of different
methods never overlap: the preparer runs one plan at a time per node, and each step waits for
the one before it.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping
from typing import Any

from agent.parking.backends.base import (
    Backend,
    BackendError,
    Move,
    RecordError,
    Residency,
    TenantRef,
    TenantState,
    Unparkable,
)
from agent.parking.methods import CUDA, parks_itself


class MultiBackend(Backend):
    """Routes each tenant to one of `methods` (name → backend); the first is the node's default."""

    name = "multi"

    def __init__(self, methods: Mapping[str, Backend]) -> None:
        if not methods:
            raise ValueError("a node needs at least one parking method")
        self.backends = dict(methods)
        self.default = next(iter(self.backends))
        self.reads_block = any(b.reads_block for b in self.backends.values())
        self._refs: dict[str, TenantRef] = {}
        self._method: dict[str, str] = {}
        self._pinned: dict[str, str] = {}
        """Methods asked for through llm-d's BackendConfig, until the tenant is resident again."""
        self._mutex = threading.Lock()

    def methods(self) -> tuple[str, ...]:
        """The node's parking methods, its default first."""
        return tuple(self.backends)

    def refusal(self, ref: TenantRef) -> str:
        """Why no method here can park the tenant; empty if one can."""
        if ref.parking and ref.parking not in self.backends:
            return (
                f"its pod asks to be parked by {ref.parking!r} (baton.dev/parking), which this "
                f"node does not offer (it parks with {', '.join(self.backends)})"
            )
        method = self.method_of(ref.tenant_id)
        if parks_itself(method) and not ref.self_parks:
            return (
                f"it is to park itself ({method}) but no session of it offers park/restore "
                "callbacks"
            )
        return ""

    def choose(self, ref: TenantRef) -> str:
        """The method for the tenant by its pod's ask, its session and the node's default."""
        if ref.parking in self.backends:
            return ref.parking
        itself = next((m for m in self.backends if parks_itself(m)), "")
        if ref.self_parks and itself:
            return itself
        return self.default

    def method_of(self, tenant_id: str) -> str:
        """The method the tenant's memory is (or would be) moved by."""
        with self._mutex:
            return self._method.get(tenant_id, self.default)

    def method_for(self, ref: TenantRef) -> str:
        """The tenant's method now if it has one (pinned, or kept while parked), else its choice."""
        with self._mutex:
            return self._method.get(ref.tenant_id) or self.choose(ref)

    def pin(self, tenant_id: str, method: str) -> None:
        """Move the tenant by `method` until it is resident again (llm-d's BackendConfig)."""
        if method not in self.backends:
            raise Unparkable(f"this node does not park with {method!r}")
        current = self.method_of(tenant_id)
        if current != method and self._parked(current, tenant_id):
            why = self.backends[current].state(tenant_id).quarantined
            raise BackendError(
                f"{tenant_id} is quarantined by {current!r} ({why}): it is moved by no method"
                if why
                else f"{tenant_id} is parked by {current!r}: restore it before moving it by "
                f"{method!r}"
            )
        with self._mutex:
            self._pinned[tenant_id] = self._method[tenant_id] = method

    def backend_for(self, method: str) -> Backend:
        """The backend of one of the node's methods."""
        return self.backends[method]

    def _parked(self, method: str, tenant_id: str) -> bool:
        """Whether `method` holds the tenant's memory: parked, or quarantined where it lies."""
        st = self.backends[method].state(tenant_id)
        held = st.parked_bytes > 0 or bool(st.quarantined)
        return held or any(r != Residency.RESIDENT for r in st.residency.values())

    def _of(self, tenant_id: str) -> Backend:
        return self.backends[self.method_of(tenant_id)]

    def attach(self, tenant: TenantRef) -> None:
        """Every method learns the tenant; its method changes only while nothing is parked."""
        for backend in self.backends.values():
            backend.attach(tenant)
        with self._mutex:
            self._refs[tenant.tenant_id] = tenant
        self._settle(tenant.tenant_id)

    def _settle(self, tenant_id: str) -> None:
        """Give the tenant the method it should have now, unless its memory is parked."""
        with self._mutex:
            ref = self._refs.get(tenant_id)
            current = self._method.get(tenant_id)
            wanted = self._pinned.get(tenant_id) or (self.choose(ref) if ref else self.default)
        if current is None or (current != wanted and not self._parked(current, tenant_id)):
            with self._mutex:
                self._method[tenant_id] = wanted

    def detach(self, tenant_id: str) -> None:
        """Every method drops the tenant."""
        for backend in self.backends.values():
            backend.detach(tenant_id)
        with self._mutex:
            for table in (self._refs, self._method, self._pinned):
                table.pop(tenant_id, None)

    def footprint(self, tenant_id: str, gpu: str) -> int:
        return self._of(tenant_id).footprint(tenant_id, gpu)

    def park(self, tenant_id: str, gpu: str) -> Move:
        """Park by the tenant's method; `Unparkable` if no method here can."""
        self._parkable(tenant_id)
        return self._of(tenant_id).park(tenant_id, gpu)

    def restore(self, tenant_id: str, gpu: str) -> Move:
        """Restore by the method that parked it; a tenant resident again may change method."""
        move = self._of(tenant_id).restore(tenant_id, gpu)
        self._restored(tenant_id)
        return move

    def moves_on_loop(self, tenant_id: str) -> bool:
        """As the tenant's method moves it."""
        return self._of(tenant_id).moves_on_loop(tenant_id)

    async def move_on_loop(self, tenant_id: str, gpu: str, direction: str) -> Move:
        """`park` or `restore` by a method that moves on the event loop."""
        if direction == "park":
            self._parkable(tenant_id)
        move = await self._of(tenant_id).move_on_loop(tenant_id, gpu, direction)
        if direction != "park":
            self._restored(tenant_id)
        return move

    def hand_restore(self, tenant_id: str, gpu: str) -> Move | None:
        """As the tenant's method does."""
        move = self._of(tenant_id).hand_restore(tenant_id, gpu)
        if move is not None:
            self._restored(tenant_id)
        return move

    def not_restored(self, tenant_id: str, gpu: str) -> None:
        """As the tenant's method does."""
        self._of(tenant_id).not_restored(tenant_id, gpu)

    def parks_itself(self, tenant_id: str) -> bool:
        """As the tenant's method does."""
        return self._of(tenant_id).parks_itself(tenant_id)

    def self_parked(self, tenant_id: str, gpu: str, moved: int) -> Move | None:
        """As the tenant's method does."""
        return self._of(tenant_id).self_parked(tenant_id, gpu, moved)

    def asleep_on(self, gpus: Collection[str]) -> list[str]:
        """As every method counts them."""
        return [t for b in self.backends.values() for t in b.asleep_on(gpus)]

    def awake_again(self, tenant_id: str) -> bool:
        """As the tenant's method says; resident again, it may change method."""
        woke = self._of(tenant_id).awake_again(tenant_id)
        if woke:
            self._restored(tenant_id)
        return woke

    def _parkable(self, tenant_id: str) -> None:
        ref = self._refs.get(tenant_id)
        why = self.refusal(ref) if ref is not None else ""
        if why:
            raise Unparkable(why)

    def _restored(self, tenant_id: str) -> None:
        if not self._parked(self.method_of(tenant_id), tenant_id):
            with self._mutex:
                self._pinned.pop(tenant_id, None)
            self._settle(tenant_id)

    def state(self, tenant_id: str) -> TenantState:
        """The tenant's method's view, with the method named and any refusal given."""
        method = self.method_of(tenant_id)
        st = self.backends[method].state(tenant_id)
        ref = self._refs.get(tenant_id)
        why = self.refusal(ref) if ref is not None else ""
        st.unparkable = st.unparkable or why
        st.method = method
        return st

    def tenants(self) -> list[str]:
        """Tenants any method holds memory for."""
        return sorted({t for b in self.backends.values() for t in b.tenants()})

    def memory_limit(self, tenant_id: str) -> int | None:
        return self._of(tenant_id).memory_limit(tenant_id)

    def memory_used(self, tenant_id: str) -> int:
        return self._of(tenant_id).memory_used(tenant_id)

    def rescan(self, tenant_id: str) -> None:
        for backend in self.backends.values():
            backend.rescan(tenant_id)

    def durable(self) -> dict[str, Any]:
        """Each method's record, and which method each tenant was moved by."""
        with self._mutex:
            methods = dict(self._method)
        return {
            "methods": {name: b.durable() for name, b in self.backends.items()},
            "tenants": methods,
        }

    def adopt(self, saved: dict[str, Any]) -> None:
        """Hand each method its record back; tenants keep the method that parked them.

        A record from an agent with one method (`--backend cuda` before) is the driver's."""
        if saved and "methods" not in saved:
            saved = {"methods": {CUDA: saved}, "tenants": dict.fromkeys(saved, CUDA)}
        for name, record in records_by_method(saved).items():
            if name in self.backends:
                self.backends[name].adopt(record)
        tenants = saved.get("tenants") or {}
        if not isinstance(tenants, Mapping):
            raise RecordError(f"'tenants' is a JSON {type(tenants).__name__}, not an object")
        with self._mutex:
            for tid, method in tenants.items():
                if method in self.backends:
                    self._method[tid] = method

    def close(self) -> None:
        for backend in self.backends.values():
            backend.close()


def records_by_method(saved: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The methods with something in a saved parking record (`durable`'s), and theirs: what a
    restarted agent must hand back to them. A record from an agent with one method is the
    driver's (`cuda`: the only method whose record is not empty; the others' memory is found
    where it lies)."""
    if saved and "methods" not in saved:
        return {CUDA: dict(saved)}
    methods = saved.get("methods") or {}
    if not isinstance(methods, Mapping):
        raise RecordError(f"'methods' is a JSON {type(methods).__name__}, not an object")
    return {name: record for name, record in methods.items() if record}
