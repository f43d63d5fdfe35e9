"""Parks tenants by asking them: their own on_park / on_restore callbacks, over their session.

Fits frameworks that know how to free their GPU memory (vLLM sleep / wake_up, moving a model and
optimizer to pinned host memory). The tenant reports the bytes it moved: that is what counts
while it is parked; resident, it counts what it declared if that is more (see `footprint`).

A parked tenant's process lives on: on a real GPU it keeps its CUDA context (about 0.5 GiB) and
its libraries' workspaces (cuBLAS) on the device. The node keeps `PARKED_HEADROOM` free on each
real GPU for them: room for the residue of every tenant but the one whose turn it is.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from agent.parking.backends.base import (
    Backend,
    BackendError,
    Move,
    Residency,
    TenantRef,
    TenantState,
    move_deadline,
)
from baton.contract.names import DEFAULT_SLOTS_PER_GPU

PARKED_RESIDUE = 768 * 1024**2
"""What a parked PyTorch tenant still holds on the device: CUDA context and cuBLAS workspaces."""
PARKED_HEADROOM = PARKED_RESIDUE * (DEFAULT_SLOTS_PER_GPU - 1)
"""Room on a real GPU for the residue of the parked tenants beside the one in its turn."""

CallTenant = Callable[[str, str, str, float], Coroutine[Any, Any, int]]
"""`(tenant_id, action, gpu, timeout) -> bytes moved`, run on the agent's event loop."""


class AppBackend(Backend):
    """Drives tenants' callbacks through `call_tenant` (the agent's sessions) on `loop`."""

    name = "app"
    reads_block = False

    def __init__(
        self,
        timeout: float = 60.0,
        call_tenant: CallTenant | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        copy_gbps: float = 1.0,
    ) -> None:
        self.timeout = timeout
        """Seconds a callback gets beyond the time its bytes take at `copy_gbps`."""
        self.copy_gbps = copy_gbps
        """The slowest rate a callback's deadline allows for moving the tenant's memory."""
        self._call = call_tenant
        self._loop = loop
        self._refs: dict[str, TenantRef] = {}
        self._parked: dict[str, dict[str, int]] = {}
        self._reported: dict[str, dict[str, int]] = {}
        self._mutex = threading.Lock()

    def attach(self, tenant: TenantRef) -> None:
        """Remember the tenant's GPUs and declared footprint."""
        self._refs[tenant.tenant_id] = tenant

    def detach(self, tenant_id: str) -> None:
        """Forget the tenant; what it offloaded lived in its own process."""
        with self._mutex:
            self._refs.pop(tenant_id, None)
            self._parked.pop(tenant_id, None)
            self._reported.pop(tenant_id, None)

    def tenants(self) -> list[str]:
        """Attached tenants."""
        return list(self._refs)

    def memory_limit(self, tenant_id: str) -> int | None:
        """The limit the tenant registered with."""
        ref = self._refs.get(tenant_id)
        return ref.memory_limit_bytes if ref and ref.memory_limit_bytes else None

    def footprint(self, tenant_id: str, gpu: str) -> int:
        """What it holds on `gpu` as far as the agent can know.

        Parked: what it reported moving. Resident: what it declared, or what it last reported if
        that is more. A report is a lower bound only until its next turn: a tenant parked before
        it allocated reports 0 bytes, then allocates during its turns, and must not be taken for
        one that holds nothing (the next tenant would be let in beside it).
        """
        with self._mutex:
            reported = self._reported.get(tenant_id, {}).get(gpu)
            parked = gpu in self._parked.get(tenant_id, {})
        if parked and reported is not None:
            return reported
        ref = self._refs.get(tenant_id)
        declared = (ref.declared_bytes or 0) if ref and gpu in ref.gpus else 0
        return max(declared, reported or 0)

    def deadline(self, tenant_id: str, gpu: str) -> float:
        """Seconds a park or restore of the tenant on `gpu` may take: the callback timeout
        and its bytes (`footprint`) at the slowest copy rate (70 GB at 1 GB/s: 70 s more)."""
        return move_deadline(self.timeout, self.footprint(tenant_id, gpu), self.copy_gbps)

    def state(self, tenant_id: str) -> TenantState:
        """Residency as the callbacks left it."""
        ref = self._refs.get(tenant_id)
        st = TenantState(tenant_id)
        with self._mutex:
            parked = dict(self._parked.get(tenant_id, {}))
        for gpu in ref.gpus if ref else ():
            st.residency[gpu] = Residency.PARKED if gpu in parked else Residency.RESIDENT
            st.footprint_bytes[gpu] = self.footprint(tenant_id, gpu)
        st.parked_bytes = sum(parked.values())
        return st

    def park(self, tenant_id: str, gpu: str) -> Move:
        """Run the tenant's on_park(gpu) and count the bytes it reports."""
        if self._done(tenant_id, gpu, "park"):
            return Move(tenant_id, gpu, "park", 0, 0.0)
        return self._moved(tenant_id, gpu, "park", *self._run(tenant_id, "park", gpu))

    def restore(self, tenant_id: str, gpu: str) -> Move:
        """Run the tenant's on_restore(gpu)."""
        if self._done(tenant_id, gpu, "restore"):
            return Move(tenant_id, gpu, "restore", 0, 0.0)
        return self._moved(tenant_id, gpu, "restore", *self._run(tenant_id, "restore", gpu))

    def moves_on_loop(self, tenant_id: str) -> bool:
        """Always: a move is a call into the tenant's process, awaited on the agent's loop."""
        return True

    async def move_on_loop(self, tenant_id: str, gpu: str, direction: str) -> Move:
        """`park` or `restore` without a worker thread: the callback is awaited where it runs."""
        if self._done(tenant_id, gpu, direction):
            return Move(tenant_id, gpu, direction, 0, 0.0)
        if self._call is None:
            raise BackendError("the app backend is not connected to the agent's sessions")
        start = asyncio.get_running_loop().time()
        try:
            moved = await self._call(tenant_id, direction, gpu, self.deadline(tenant_id, gpu))
        except Exception as e:
            raise BackendError(f"{tenant_id}: on_{direction}({gpu}) failed: {e}") from e
        seconds = asyncio.get_running_loop().time() - start
        return self._moved(tenant_id, gpu, direction, int(moved), seconds)

    def hand_restore(self, tenant_id: str, gpu: str) -> Move | None:
        """Resident from now: its client restores what it parked before it uses the grant (and
        answers a park asked before it did with what that park moved, so nothing is lost if
        the grant never reaches it)."""
        if self._done(tenant_id, gpu, "restore"):
            return Move(tenant_id, gpu, "restore", 0, 0.0)
        with self._mutex:
            moved = self._parked.get(tenant_id, {}).get(gpu, 0)
        return self._moved(tenant_id, gpu, "restore", moved, 0.0)

    def not_restored(self, tenant_id: str, gpu: str) -> None:
        """Parked again, as its last park left it: with what that park reported (the agent's
        own record, not the client's word); nothing if no park of it there was seen."""
        with self._mutex:
            reported = self._reported.get(tenant_id, {}).get(gpu)
        if reported is not None:
            self._moved(tenant_id, gpu, "park", reported, 0.0)

    def parks_itself(self, tenant_id: str) -> bool:
        """Always: its callbacks are its own process's."""
        return True

    def self_parked(self, tenant_id: str, gpu: str, moved: int) -> Move | None:
        """Parked from now, with what its park reported (as a park callback's answer); one
        parked already keeps the record of the park that parked it."""
        if self._done(tenant_id, gpu, "park"):
            return Move(tenant_id, gpu, "park", 0, 0.0)
        return self._moved(tenant_id, gpu, "park", moved, 0.0)

    def _done(self, tenant_id: str, gpu: str, direction: str) -> bool:
        """Whether the tenant is already where the move would take it."""
        with self._mutex:
            parked = gpu in self._parked.get(tenant_id, {})
        return parked == (direction == "park")

    def _moved(self, tenant_id: str, gpu: str, direction: str, moved: int, seconds: float) -> Move:
        """Record a finished move: what a park reported, or the tenant back on the GPU."""
        with self._mutex:
            if direction == "park":
                self._parked.setdefault(tenant_id, {})[gpu] = moved
                self._reported.setdefault(tenant_id, {})[gpu] = moved
            else:
                self._parked.get(tenant_id, {}).pop(gpu, None)
        return Move(tenant_id, gpu, direction, moved, seconds)

    def _run(self, tenant_id: str, action: str, gpu: str) -> tuple[int, float]:
        """Call the tenant from a worker thread; raise `BackendError` if it fails or is late."""
        if self._call is None or self._loop is None:
            raise BackendError("the app backend is not connected to the agent's sessions")
        loop = self._loop
        start = loop.time()
        deadline = self.deadline(tenant_id, gpu)
        future = asyncio.run_coroutine_threadsafe(
            self._call(tenant_id, action, gpu, deadline), loop
        )
        try:
            moved = future.result(deadline + 5.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise BackendError(
                f"{tenant_id} did not finish on_{action}({gpu}) within {deadline:g} s"
            ) from None
        except Exception as e:
            raise BackendError(f"{tenant_id}: on_{action}({gpu}) failed: {e}") from e
        return int(moved), loop.time() - start
