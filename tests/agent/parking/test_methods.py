"""Several parking methods on one node: each tenant parks its own way, on one GPU, in order."""

from __future__ import annotations

import logging

import pytest

from agent.node.podwatch import pod_tenant
from agent.node.tenants import Tenant
from agent.parking.backends.base import (
    Backend,
    BackendError,
    BackendUnavailable,
    Move,
    Residency,
    TenantRef,
    TenantState,
    Unparkable,
)
from agent.parking.methods import parking_methods
from agent.parking.multi import MultiBackend
from agent.parking.preparer import ParkingPreparer
from agent.parking.setup import ParkingOptions, build_backend, parse_fake_gpus
from agent.server.service import tenant_ref
from baton.contract import names
from baton.contract.annotations import decode_parking
from commands.demo.fakenode import FakeNode, FakeNodeOptions

from .nodeharness import APP_TENANT, TenantProc, run, with_node

GPU = "GPU-0"


class Recorder(Backend):
    """A method that remembers what it parked and every call made to it."""

    def __init__(self, name: str, calls: list[tuple[str, str, str]]) -> None:
        self.name = name
        self.calls = calls
        self.parked: set[str] = set()

    def attach(self, tenant: TenantRef) -> None:
        pass

    def detach(self, tenant_id: str) -> None:
        self.parked.discard(tenant_id)

    def footprint(self, tenant_id: str, gpu: str) -> int:
        return 10

    def park(self, tenant_id: str, gpu: str) -> Move:
        self.calls.append((self.name, "park", tenant_id))
        self.parked.add(tenant_id)
        return Move(tenant_id, gpu, "park", 10, 0.0)

    def restore(self, tenant_id: str, gpu: str) -> Move:
        self.calls.append((self.name, "restore", tenant_id))
        self.parked.discard(tenant_id)
        return Move(tenant_id, gpu, "restore", 10, 0.0)

    def state(self, tenant_id: str) -> TenantState:
        where = Residency.PARKED if tenant_id in self.parked else Residency.RESIDENT
        return TenantState(tenant_id, {GPU: where}, {GPU: 10}, 10 * (where == Residency.PARKED))

    def durable(self) -> dict[str, object]:
        return {t: {"pids": {}} for t in sorted(self.parked)}  # the cuda backend's shape

    def adopt(self, saved: dict[str, object]) -> None:
        self.parked = set(saved)


def node(calls: list[tuple[str, str, str]]) -> MultiBackend:
    return MultiBackend({m: Recorder(m, calls) for m in ("cuda", "app", "fake")})


def test_each_tenant_parks_by_its_pods_ask_its_own_callbacks_or_the_nodes_default():
    calls: list[tuple[str, str, str]] = []
    multi = node(calls)
    multi.attach(TenantRef("plain", (GPU,)))
    multi.attach(TenantRef("offloads", (GPU,), self_parks=True))
    multi.attach(TenantRef("asks-fake", (GPU,), parking="fake", self_parks=True))
    for tenant in ("plain", "offloads", "asks-fake"):
        multi.park(tenant, GPU)
        multi.restore(tenant, GPU)
    assert [(m, t) for m, d, t in calls if d == "park"] == [
        ("cuda", "plain"),
        ("app", "offloads"),
        ("fake", "asks-fake"),
    ]
    assert [multi.state(t).method for t in ("plain", "offloads")] == ["cuda", "app"]


def test_a_tenant_no_method_can_park_is_refused_with_the_reason():
    multi = MultiBackend({"fake": Recorder("fake", [])})
    multi.attach(TenantRef("t", (GPU,), parking="cuda"))
    why = multi.state("t").unparkable
    assert "'cuda'" in why and "baton.dev/parking" in why and "fake" in why
    with pytest.raises(Unparkable, match="does not offer"):
        multi.park("t", GPU)
    several = node([])
    several.attach(TenantRef("silent", (GPU,), parking="app"))  # asks to park itself, cannot yet
    assert "no session of it offers park/restore callbacks" in several.state("silent").unparkable
    with pytest.raises(Unparkable, match="callbacks"):
        several.park("silent", GPU)


def test_a_parked_tenant_is_restored_by_the_method_that_parked_it():
    calls: list[tuple[str, str, str]] = []
    multi = node(calls)
    multi.attach(TenantRef("t", (GPU,)))
    multi.park("t", GPU)
    multi.attach(TenantRef("t", (GPU,), self_parks=True))  # its session now offers callbacks
    assert multi.method_of("t") == "cuda"
    with pytest.raises(BackendError, match="parked by 'cuda'"):
        multi.pin("t", "app")
    multi.restore("t", GPU)
    multi.attach(TenantRef("t", (GPU,), self_parks=True))
    assert multi.method_of("t") == "app"
    assert calls == [("cuda", "park", "t"), ("cuda", "restore", "t")]


def test_the_method_of_a_parked_tenant_survives_a_restart():
    multi = node([])
    multi.attach(TenantRef("t", (GPU,), self_parks=True))
    multi.park("t", GPU)
    saved = multi.durable()
    again = node([])
    again.adopt(saved)
    again.attach(TenantRef("t", (GPU,)))  # reconnecting: no callbacks yet
    assert again.method_of("t") == "app" and again.state("t").parked_bytes == 10


def test_a_restart_between_one_method_and_several_keeps_what_the_driver_parked():
    single = Recorder("cuda", [])
    single.parked.add("t")
    several = node([])
    several.adopt(single.durable())  # was --backend cuda, now cuda,app,fake
    assert several.method_of("t") == "cuda" and several.state("t").parked_bytes == 10
    alone = ParkingPreparer(Recorder("cuda", []), {GPU: 100}, host_budget=1000)
    alone.reinstate(several.durable())  # and back to --backend cuda
    assert alone.backend.state("t").parked_bytes == 10


def test_backend_takes_a_list_and_one_name_as_before():
    assert parking_methods("fake") == ("fake",)
    assert parking_methods("cuda, app") == ("cuda", "app")
    with pytest.raises(BackendUnavailable, match="unknown backend 'tpu'"):
        parking_methods("fake,tpu")
    with pytest.raises(BackendUnavailable, match="alone"):
        parking_methods("none,fake")
    single, _ = build_backend(ParkingOptions(backend="fake", fake_gpus="1x100"))
    assert single.name == "fake" and single.methods() == ("fake",)
    both, gpus = build_backend(ParkingOptions(backend="fake,app", fake_gpus="1x100"))
    assert isinstance(both, MultiBackend) and both.methods() == ("fake", "app")
    assert gpus == parse_fake_gpus("1x100")


def test_the_pods_parking_annotation_reaches_the_backend():
    assert decode_parking({"baton.dev/parking": " CUDA "}) == "cuda"
    assert decode_parking({}) == ""
    annotations = {names.ANNOTATION_ASSIGNED_GPUS: GPU, names.ANNOTATION_PARKING: "cuda"}
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": annotations},
        "spec": {"containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }
    tenant = pod_tenant(pod)
    assert tenant is not None and tenant.parking == "cuda"
    assert Tenant.from_json(tenant.to_json()).parking == "cuda"
    assert tenant_ref(tenant, self_parks=True).parking == "cuda"
    multi = node([])
    multi.attach(tenant_ref(tenant, self_parks=True))
    assert multi.method_of("ns/p") == "cuda", "the pod's ask wins over its callbacks"


class Moves(logging.Handler):
    """Every move the preparer starts and finishes, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if " starts (" in message or " bytes in " in message:
            self.lines.append(message)


def test_a_driver_parked_and_a_self_offloading_tenant_share_one_gpu_in_order():
    """A fake-GPU tenant (parked by the node) and an app tenant (parks itself) that do not fit
    together take turns on one GPU, the first holding its turn until revoked (forced parks);
    each is parked by its own method, data verified every turn, and no move starts before the
    one before it has finished (a restore waits for the park that makes its room)."""
    moves = Moves()
    logger = logging.getLogger("agent.parking")
    logger.addHandler(moves)
    logger.setLevel(logging.INFO)

    async def body(node: FakeNode, tenants: list[TenantProc]) -> None:
        env = node.tenant_env()
        driver = await TenantProc.start(env, "driver", 60, "--turns", "3", "--hold")
        tenants.append(driver)
        await driver.until("holding")
        flags = ("--turns", "3", "--pause-after", "2")
        selfish = await TenantProc.start(env, "selfish", 60, *flags, argv=APP_TENANT)
        tenants.append(selfish)
        while (await selfish.until("turn", 60))["i"] < 2:
            pass  # each of its turns came by revoking the driver's held turn
        status = node.agent.parking.status()
        assert status["methods"] == ["fake", "app"]
        assert {t: e["method"] for t, e in status["tenants"].items()} == {
            "local/driver": "fake",
            "local/selfish": "app",
        }
        registry = node.agent.service.metrics.registry
        for method in ("fake", "app"):
            for direction in ("park", "restore"):
                labels = {"backend": method, "direction": direction}
                assert (registry.get_sample_value("baton_moves_total", labels) or 0) >= 1, labels
        for t in tenants:
            t.tell()
            await t.until("done", 60)
            assert await t.exit_code() == 0, t.describe()

    try:
        options = FakeNodeOptions(backend="fake,app", fake_gpus="1x100", max_hold=0.3)
        run(with_node(options, body))
    finally:
        logger.removeHandler(moves)
    assert moves.lines, "the tenants never moved"
    for start, end in zip(moves.lines[::2], moves.lines[1::2], strict=True):
        assert " starts (" in start and " bytes in " in end, moves.lines
        direction, _, tenant = start.split(" ")[:3]
        assert end.startswith(f"{direction} {tenant} "), (start, end)
    # Each move the node made is by its tenant's method. The app tenant's parks may all be its
    # own at its yields (the metrics above count them), as when the driver waits at each one.
    made = {(line.split(" ")[2], line.split(" by ")[1].split(" ")[0]) for line in moves.lines[::2]}
    assert ("local/driver", "fake") in made
    assert made <= {("local/driver", "fake"), ("local/selfish", "app")}, made
