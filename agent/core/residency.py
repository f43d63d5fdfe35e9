"""The seam between the lease service and memory movement.

The lease service owns turns; a `TurnPreparer` owns where tenants' memory is. Before granting a
turn the lease service awaits `prepare`; it never moves memory itself. A yield only says the
turn ended (`released`): parking is lazy, and happens only when a later `prepare` needs the
room. While a GPU is held, the lease service names the tenant due next with `prepare_ahead`
(`agent.core.ahead`), so its room can be made before the holder yields and its grant moves
nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol


class NoRoom(Exception):
    """The turn cannot be granted yet (e.g. a park would exceed the host DRAM budget).

    The message names the numbers. The lease service keeps the waiter queued and calls
    `prepare` again when the node's state changes (a yield, a tenant leaving, a budget change).
    """


class TooLarge(NoRoom):
    """The tenant needs more memory on a GPU than the GPU holds: no move can ever make room."""


class MoveFailed(NoRoom):
    """A park or restore the turn needs failed each time it was tried (a callback that raised or
    was late): the lease service tries the turn again a while later, as nothing else may change."""


class TurnPreparer(Protocol):
    """Makes a tenant's memory resident on its GPUs before its turn."""

    async def prepare(self, tenant_id: str, gpus: Sequence[str], handed: bool = False) -> None:
        """Make room and restore the tenant on `gpus`; raise `NoRoom` if that cannot happen now.

        `handed`: the tenant restores itself as its grant reaches it (its client asked to,
        `restores_with_grant`), so its own restores may be left to it.
        """
        ...

    async def prepare_ahead(
        self, tenant_id: str, gpus: Sequence[str], holders: Collection[str] = ()
    ) -> None:
        """`tenant_id` is due next on `gpus`, which `holders` hold: make it resident now if it can.

        Best effort: raises nothing, never parks a holder, and a later `prepare` of the same
        tenant awaits it rather than moving anything twice.
        """
        ...

    def held(self, tenant_id: str, gpus: Sequence[str]) -> None:
        """The tenant holds a turn on `gpus` that was not prepared here (one restored after an
        agent restart): it may allocate there until the turn ends."""
        ...

    def released(self, tenant_id: str, gpus: Sequence[str]) -> None:
        """The tenant's turn on `gpus` ended (a yield): it may be parked from now on."""
        ...

    async def revoke(
        self,
        tenant_id: str,
        gpus: Sequence[str],
        holds: Callable[[], bool] = ...,
        waited: Callable[[], bool] = ...,
    ) -> bool:
        """The tenant's lease is revoked (max hold passed while others wait): park it. Whether
        it was: not if, asked before anything moves, its lease no longer `holds` or nobody is
        `waited` for (the holder yielded, the waiters left), nothing moved."""
        ...

    async def forget(self, tenant_id: str) -> None:
        """The tenant is gone for good: release what is held for it, parked bytes included."""
        ...

    def status(self) -> dict[str, Any]:
        """Per tenant residency for /v1/status (JSON-serialisable)."""
        ...

    def residency_of(self, tenant_id: str) -> dict[str, str]:
        """GPU → `resident`/`parked`/`parking`/`restoring` of one tenant (its `status` entry's
        `gpus`), without building every tenant's status; empty for a tenant with no memory."""
        ...

    def on_gpus(self, tenant_id: str) -> int:
        """The tenant's memory on its GPUs, not parked, as last read (0: none, or unknown)."""
        ...

    def parked_by_tenant(self) -> dict[str, int]:
        """Bytes each tenant has parked in host DRAM now (tenants with none left out), without
        reading the backend or building `status`: the accounting reads it at every move."""
        ...

    def rescan(self, tenant_id: str) -> None:
        """The tenant opened a session: its processes may have changed."""
        ...

    def durable(self) -> dict[str, Any]:
        """What must survive an agent restart (which processes are parked), JSON-serialisable."""
        ...

    def reinstate(self, saved: dict[str, Any]) -> None:
        """Take back what `durable` returned before a restart."""
        ...


class NullPreparer:
    """Moves nothing: every tenant is always resident. Used when no backend is configured."""

    async def prepare(self, tenant_id: str, gpus: Sequence[str], handed: bool = False) -> None:
        """Nothing to make room for."""

    async def prepare_ahead(
        self, tenant_id: str, gpus: Sequence[str], holders: Collection[str] = ()
    ) -> None:
        """Nothing to prepare."""

    def held(self, tenant_id: str, gpus: Sequence[str]) -> None:
        """Nothing to count."""

    def released(self, tenant_id: str, gpus: Sequence[str]) -> None:
        """Nothing to count."""

    async def revoke(
        self,
        tenant_id: str,
        gpus: Sequence[str],
        holds: Callable[[], bool] = lambda: True,
        waited: Callable[[], bool] = lambda: True,
    ) -> bool:
        """Nothing to park: revoked at once."""
        return True

    async def forget(self, tenant_id: str) -> None:
        """Nothing to release."""

    def status(self) -> dict[str, Any]:
        """No residency information."""
        return {}

    def residency_of(self, tenant_id: str) -> dict[str, str]:
        """No residency information."""
        return {}

    def on_gpus(self, tenant_id: str) -> int:
        """No memory known."""
        return 0

    def parked_by_tenant(self) -> dict[str, int]:
        """Nothing parked."""
        return {}

    def rescan(self, tenant_id: str) -> None:
        """No processes to find."""

    def durable(self) -> dict[str, Any]:
        """Nothing parked."""
        return {}

    def reinstate(self, saved: dict[str, Any]) -> None:
        """Nothing to take back."""


def residency(preparer: TurnPreparer) -> dict[str, dict[str, str]]:
    """Tenant id → GPU → `resident`/`parked`/`parking`/`restoring`, for tenants with memory."""
    tenants: dict[str, Any] = preparer.status().get("tenants", {})
    return {tid: dict(entry.get("gpus", {})) for tid, entry in tenants.items()}


def parked_on(gpus: dict[str, str], wanted: Collection[str]) -> bool:
    """Whether any of `wanted` holds the tenant's memory parked."""
    return any(gpus.get(g) == "parked" for g in wanted)
