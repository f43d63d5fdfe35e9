"""What the preparer knows of the node: its tenants, who holds a turn, the residency model,
and the reads that keep the model current. What the model alone decides (whether a turn moves
nothing, the plans drawn from it) is `agent.parking.from_model`'s.

The model (`agent.parking.model`) is read in full where it cannot plan a turn (the preparer's
`_moves_from_model`), and the tenants a plan moved are read after its moves, in a worker thread;
after a turn granted on the model's word, the tenants whose turns ended are read again off the
grant's path (`_settle`), and a holder granted on a view that read proves wrong gets its room at
once (`_make_room_for_holder`, the preparer's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from agent.core.planner import NodeView, Plan, Refusal, TenantView
from agent.parking.backends.base import Backend, Residency, TenantRef, TenantState
from agent.parking.host import ParkingHost
from agent.parking.methods import CUDA
from agent.parking.metrics import ParkingMetrics
from agent.parking.model import Read, ResidencyModel
from agent.parking.quarantine import Quarantines
from agent.parking.view import tenant_status, tenant_view

log = logging.getLogger(__name__)

SETTLE_AFTER_S = (0.0005, 0.05)
"""How long after a grant made from the model the tenants whose turns ended are read: half the
last turn (between grants), within these bounds, so that the read falls in the middle of the
new turn, away from the handoffs at either end."""


@contextlib.contextmanager
def counted(table: dict[str, int], tenants: Iterable[str]) -> Iterator[None]:
    """Each of `tenants` counted in `table` while the block runs (a tenant is in it while any
    block counting it runs: `_in_motion`, `_forgetting`)."""
    tenants = list(tenants)
    for t in tenants:
        table[t] = table.get(t, 0) + 1
    try:
        yield
    finally:
        for t in tenants:
            table[t] -= 1
            if not table[t]:
                del table[t]


class KnownNode:
    """The node as the preparer knows it; `ModelPlans` adds what the model alone decides,
    `PlanMoves` the moves, `ParkingPreparer` the plans read from the node."""

    def __init__(
        self,
        backend: Backend,
        gpu_memory: Mapping[str, int],
        *,
        host_budget: int,
        headroom: int = 0,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        attempts: int = 3,
        backoff: float = 0.2,
        host: ParkingHost | None = None,
    ) -> None:
        self.backend = backend
        self.gpu_memory = dict(gpu_memory)
        self.host_budget = host_budget
        self.headroom = headroom
        self.metrics = ParkingMetrics(backend.name, registry, backend.methods())
        self.metrics.host_budget.set(host_budget)
        self._clock = clock
        self._wall = wall_clock
        self._attempts = attempts
        self._backoff = backoff
        self._lock = asyncio.Lock()
        self._refs: dict[str, TenantRef] = {}
        self._last_turn: dict[str, float] = {}
        self._last_turn_wall: dict[str, float] = {}
        self._holding: dict[str, frozenset[str]] = {}
        self._model = ResidencyModel()
        """Every tenant's state and memory cgroup as last read, and who may have grown since."""
        self._revision = 0
        """Counts changes to the tenants registered here and their methods (`_verdicts`)."""
        self._verdicts: dict[tuple[Any, ...], Plan | Refusal | None] = {}
        """The plans over the model (`_model_plan`), by what they were drawn from besides the
        model and the tenants; kept while those (`_verdicts_at`) stay as they were."""
        self._verdicts_at = (-1, -1)
        self._current_for: tuple[Mapping[str, TenantRef], tuple[int, int]] | None = None
        """The host's tenants (the same dict until they change) last found current, and when."""
        self._settling: asyncio.Task[None] | None = None
        self._settle_timer: asyncio.TimerHandle | None = None
        self._granted_at = float("-inf")
        self._turn_s = 0.0
        """The time between the last two grants (of any GPU): how long a turn lasts here."""
        self._waiting: dict[str, str] = {}
        self._refused: dict[str, str] = {}
        """Tenant → the reason its waiting turn was counted in `baton_refused_parks_total`: a
        turn tried again and again counts once per reason, until it is taken."""
        self._ahead: dict[str, asyncio.Future[None]] = {}
        self._forgetting: dict[str, int] = {}
        """Tenant → its `forget`s yet to run (they wait for the lock): the model still shows
        what it left, so its turns are planned under the lock, after them."""
        self._in_motion: dict[str, int] = {}
        """Tenant → the plans moving its memory now (`moving`)."""
        self._promised: dict[str, dict[str, int]] = {}
        """Holder → GPU → bytes it may put in host DRAM: told to park at its yield, or its
        restore left to it (`told_to_park`, `_hand_over`)."""
        self._host = host
        """The agent: only its tenants count, and it hears of quarantines and moves; None alone."""
        self.quarantines = Quarantines(self.metrics, host)

    def register(self, ref: TenantRef) -> None:
        """Learn a tenant's GPUs, PIDs, memory limit and declared footprint."""
        self._revision += 1
        self._refs[ref.tenant_id] = ref
        self.backend.attach(ref)

    def _take_turn(self, tenant_id: str, gpus: Sequence[str]) -> None:
        """Room is made: the tenant holds `gpus` from now on (and may allocate there)."""
        now = self._clock()
        self._turn_s, self._granted_at = now - self._granted_at, now
        self._granted_over(gpus)
        self._waiting.pop(tenant_id, None)
        self._refused.pop(tenant_id, None)
        self._holding[tenant_id] = self._holding.get(tenant_id, frozenset()) | frozenset(gpus)
        self._model.granted(tenant_id)
        self._last_turn[tenant_id] = self._clock()
        self._last_turn_wall[tenant_id] = self._wall()

    def held(self, tenant_id: str, gpus: Sequence[str]) -> None:
        """A turn restored after an agent restart: the tenant holds `gpus` and may allocate
        there, so plans count it busy and with its whole footprint until its turn ends (the
        model read after the restart has it only as it was then)."""
        self._take_turn(tenant_id, gpus)

    def released(self, tenant_id: str, gpus: Collection[str]) -> None:
        """The tenant's turn on `gpus` ended: it no longer holds them (a tenant granted only
        some of its GPUs is otherwise held busy on all of them until another turn is granted
        on one of those), but holds its other turns' (one process a GPU, each taking turns of
        its own). It stays unsettled until it is read."""
        promised = self._promised.pop(tenant_id, {})
        self._revision += bool(promised.keys() & set(gpus))  # what it parked is counted now
        if left := {g: n for g, n in promised.items() if g not in gpus}:
            self._promised[tenant_id] = left
        held = self._holding.get(tenant_id)
        if held is not None and held & set(gpus):
            rest = held - set(gpus)
            if rest:
                self._holding[tenant_id] = rest
            else:
                del self._holding[tenant_id]

    def _granted_over(self, gpus: Collection[str]) -> None:
        """A turn on `gpus` starts: whoever held them does not any more (its end unheard)."""
        for other, held in list(self._holding.items()):
            if held & set(gpus):
                self.released(other, gpus)

    def resident_bytes(self) -> dict[str, int]:
        """Device bytes in use on each GPU, as the backend counts them (`TenantState`)."""
        used = dict.fromkeys(self.gpu_memory, 0)
        for st in self._model.states.values():
            for gpu, n in _on_gpus(st).items():
                used[gpu] = used.get(gpu, 0) + n
        return used

    def on_gpus(self, tenant_id: str) -> int:
        """The tenant's memory on its GPUs, not parked, as the model last read it (0: none, or
        unknown)."""
        st = self._model.states.get(tenant_id)
        return 0 if st is None else sum(_on_gpus(st).values())

    def rescan(self, tenant_id: str) -> None:
        """A session opened: the backend finds the tenant's processes again on next use."""
        self.backend.rescan(tenant_id)

    def durable(self) -> dict[str, Any]:
        """The backend's record of parked processes, for the agent's state file. One method's
        but the driver's is kept as several methods' are, naming it (a record of one method
        alone is read back as the driver's)."""
        record, name = self.backend.durable(), self.backend.name
        if record and self.backend.methods() == (name,) and name != CUDA:
            return {"methods": {name: record}, "tenants": dict.fromkeys(record, name)}
        return record

    def reinstate(self, saved: dict[str, Any]) -> None:
        """Hand the record saved before a restart back to the backend (it confirms it)."""
        if "methods" in saved and self.backend.methods() == (self.backend.name,):
            saved = saved["methods"].get(self.backend.name) or {}  # one method of several before
        if saved:
            self.backend.adopt(saved)

    def _tenant_ids(self) -> list[str]:
        """Tenants that count: the host's, else every one registered or in the backend.

        A tenant the host has dropped no longer counts, even before `forget` has run.
        """
        if self._host is None:
            return sorted(set(self._refs) | set(self.backend.tenants()))
        refs = self._host.tenant_refs()
        for tenant_id, ref in refs.items():
            if self._refs.get(tenant_id) != ref:
                self.register(ref)
        return sorted(refs)

    def _view(
        self,
        tenant_id: str,
        st: TenantState,
        busy: Collection[str] = (),
        whole: bool = False,
        ended: Collection[str] = (),
    ) -> TenantView:
        """The planner's view of one tenant from the backend's state and what we know (`whole`:
        with its whole footprint on every GPU, allocated or not; `ended`: holders taken as if
        their turns had ended)."""
        return tenant_view(
            st,
            self._refs.get(tenant_id),
            method=st.method or self.backend.method_of(tenant_id),
            gpu_memory=self.gpu_memory,
            last_turn=self._last_turn.get(tenant_id, float("-inf")),
            busy=(tenant_id in self._holding and tenant_id not in ended) or tenant_id in busy,
            cgroup=self._model.cgroups.get(tenant_id, (None, 0)),
            all_of_it=whole,
            headroom=self.headroom,
        )

    async def _reread(self, busy: Collection[str] = ()) -> NodeView:
        """Read every tenant from the backend (in a worker thread); the node, `busy` holding
        turns."""
        if self.backend.reads_block:
            read = await asyncio.to_thread(self._read_all)
        else:  # the backend reads its own memory: no thread needed
            read = self._read_all()
        self._model.replace_all(read, self._holding.keys())
        self._took_in(read)
        return self._node(busy)

    def _node(
        self,
        busy: Collection[str] = (),
        whole: Collection[str] = (),
        on: Collection[str] | None = None,
        ended: Collection[str] = (),
    ) -> NodeView:
        """The node as the model has it, `busy` holding turns, `whole` counted with their whole
        footprints (`model.ResidencyModel.unsettled`); only the tenants `on` those GPUs if given
        (enough to tell whether a turn there moves anything); `ended` as if they had yielded."""
        views = {
            t: self._view(t, st, busy, t in whole, ended)
            for t, st in self._model.states.items()
            if on is None or self._shares(t, st, on)
        }
        return NodeView(self.gpu_memory, views, self.headroom, self.host_budget, self._promises())

    def _promises(self, besides: str = "") -> int:
        """Host DRAM that holders (but `besides`) may yet take (`_promised`)."""
        mine = [(t, g, n) for t, by_gpu in self._promised.items() for g, n in by_gpu.items()]
        return sum(n for t, g, n in mine if t != besides and g in self._holding.get(t, ()))

    def _shares(self, tenant_id: str, st: TenantState, gpus: Collection[str]) -> bool:
        """Whether the tenant uses or holds memory on one of `gpus`."""
        ref = self._refs.get(tenant_id)
        return any(g in st.residency or (ref is not None and g in ref.gpus) for g in gpus)

    def _read_all(self) -> Read:
        """Every tenant that counts, as the backend reports it now (in a worker thread if the
        backend's reads block)."""
        generation = self._model.generation
        return self._read(self._tenant_ids(), generation)

    def _read(self, ids: Collection[str], generation: int) -> Read:
        """Tenants' states and memory cgroups from the backend (as `_read_all`)."""
        states = {t: self.backend.state(t) for t in ids}
        cgroups = {t: (self.backend.memory_limit(t), self.backend.memory_used(t)) for t in ids}
        return Read(states, cgroups, generation)

    async def _read_aside(self, ids: Collection[str]) -> Read:
        """Some tenants from the backend, in a worker thread if its reads block (`_read`)."""
        generation = self._model.generation
        if self.backend.reads_block:
            return await asyncio.to_thread(self._read, ids, generation)
        return self._read(ids, generation)

    def _took_in(self, read: Read) -> None:
        """After a read: note quarantines and tenants holding more than they declared."""
        self.quarantines.note_all(read.states)
        for tenant_id, st in read.states.items():
            ref = self._refs.get(tenant_id)
            declared = ref.declared_bytes if ref else None
            most = max(st.footprint_bytes.values(), default=0)
            if declared and most > declared and tenant_id not in self._model.outgrew:
                log.warning(
                    "%s holds %d bytes on a GPU, more than the %d it declared; its grants read "
                    "the node from now on",
                    tenant_id, most, declared,
                )  # fmt: skip
                self._model.note_outgrown(tenant_id)
        self._publish()

    def _settle_soon(self) -> None:
        """Read the tenants whose turns ended since they were last read, in the middle of the
        turn just granted (`SETTLE_AFTER_S`): off the handoffs' path."""
        if self._settling is None and self._settle_timer is None:
            soonest, latest = SETTLE_AFTER_S
            after = min(latest, max(soonest, self._turn_s / 2))
            self._settle_timer = asyncio.get_running_loop().call_later(after, self._settle_now)

    def _settle_now(self, holders_too: Collection[str] = ()) -> None:
        """Start reading the tenants whose turns ended (and those of `holders_too` that hold a
        turn: read, they stay unsettled)."""
        if self._settle_timer is not None:
            self._settle_timer.cancel()
            self._settle_timer = None
        if self._settling is not None:
            return
        ids = [t for t in self._model.unsettled if t not in self._holding or t in holders_too]
        if ids:
            self._settling = asyncio.get_running_loop().create_task(self._settle(ids))

    async def _settle(self, ids: list[str]) -> None:
        dropped = False
        try:
            read = await self._read_aside(ids)
            if self._lock.locked() or read.generation != self._model.generation:
                dropped = True  # memory moved meanwhile: read them again, later in the turn
                return
            for wrong in self._model.settle(read, self._holding.keys()):
                log.warning("%s", wrong)
            self._took_in(read)
            short = [t for t in self._holding if not self._moves_nothing(t, self._holding[t])]
        except Exception as e:  # the next plan reads the node in full
            log.warning("reading %s after their turns failed: %s", ", ".join(ids), e)
            return
        finally:
            self._settling = None
            if dropped:
                self._settle_soon()
        for holder in short:  # granted on a view the read proved wrong: make its room now
            await self._make_room_for_holder(holder)

    def _publish(self) -> None:
        self.metrics.parked_bytes.set(self._parked_bytes())

    def _parked_bytes(self) -> int:
        """Bytes parked in host DRAM across the node, as the model has them."""
        return sum(st.parked_bytes for st in self._model.states.values())

    def status(self) -> dict[str, Any]:
        """Node and per tenant residency for /v1/status."""
        states = self._model.states
        tenants = {
            tenant_id: tenant_status(
                st,
                self._view(tenant_id, st),
                method=st.method or self.backend.method_of(tenant_id),
                last_turn_wall=self._last_turn_wall.get(tenant_id),
                quarantined=st.quarantined or self.quarantines.why.get(tenant_id, ""),
                waiting=self._waiting.get(tenant_id),
            )
            for tenant_id, st in sorted(states.items())
        }
        return {
            "backend": self.backend.name,
            "methods": list(self.backend.methods()),
            "parked_bytes": self._parked_bytes(),
            "host_memory_budget_bytes": self.host_budget,
            "headroom_bytes": self.headroom,
            "tenants": tenants,
        }

    def _moves_nothing(
        self, tenant_id: str, gpus: Collection[str], holders: Collection[str] | None = None
    ) -> bool:
        """Whether the model shows that the tenant's grant moves nothing (`ModelPlans`')."""
        raise NotImplementedError

    async def _make_room_for_holder(self, tenant_id: str) -> None:
        """Make the holder's room during its turn (the preparer's)."""
        raise NotImplementedError


def _on_gpus(st: TenantState) -> dict[str, int]:
    """The tenant's device bytes on each GPU where its memory is not parked."""
    return {
        gpu: st.footprint_bytes.get(gpu, 0)
        for gpu, where in st.residency.items()
        if where != Residency.PARKED
    }
