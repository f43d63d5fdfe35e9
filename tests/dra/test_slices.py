"""The ResourceSlice the driver publishes, and how it is kept current."""

from __future__ import annotations

import copy
from typing import Any

from baton.contract import names
from dra.publisher import publish_once
from dra.slices import TAINT_UNHEALTHY, resource_slice, same_devices, slice_name
from nodegpu.inventory import Inventory, NodeGpu
from nodegpu.state import LiveInventory

GPUS = (NodeGpu("GPU-a", 0, "H100", 81920), NodeGpu("GPU-b", 1, "H100", 81920))


def no_uid() -> str:
    return ""


def unasked() -> str:
    raise AssertionError("the node's UID is read only before a write")


def test_one_shareable_device_per_gpu_with_capacities() -> None:
    body = resource_slice("n1", Inventory(GPUS, 4), 3, node_uid="u1")
    spec = body["spec"]
    assert spec["driver"] == names.DRA_DRIVER and spec["nodeName"] == "n1"
    assert spec["pool"] == {"name": "n1", "generation": 3, "resourceSliceCount": 1}
    assert body["metadata"]["ownerReferences"][0]["uid"] == "u1"
    first = spec["devices"][0]
    assert first["name"] == "gpu-0" and first["allowMultipleAllocations"] is True
    assert first["attributes"]["uuid"] == {"string": "GPU-a"}
    gib80 = 81920 * names.MIB
    memory = first["capacity"]["memory"]
    assert memory["value"] == str(4 * gib80), "memory beyond the GPU's is parked: slots x GPU"
    assert memory["requestPolicy"]["validRange"]["max"] == str(gib80)
    assert memory["requestPolicy"]["default"] == str(gib80)
    duty = first["capacity"]["duty"]
    assert duty["value"] == "100" and duty["requestPolicy"]["default"] == "25"
    slots = first["capacity"]["slots"]
    assert slots["value"] == "4" and slots["requestPolicy"]["validValues"] == ["1"]
    assert "taints" not in first


def test_unhealthy_gpu_is_tainted_not_removed() -> None:
    inventory = Inventory(GPUS, 2).with_health("GPU-b", False, "XID 79")
    devices = resource_slice("n1", inventory, 1)["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1"]
    assert devices[1]["taints"] == [
        {"key": TAINT_UNHEALTHY, "value": "true", "effect": "NoSchedule"}
    ]


class Slices:
    """This driver's slices on one node, as the API server keeps them."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []

    def list_slices(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(s) for s in self.items.values()]

    def create_slice(self, body: dict[str, Any]) -> None:
        self.calls.append("create")
        self.items[body["metadata"]["name"]] = copy.deepcopy(body)

    def replace_slice(self, name: str, body: dict[str, Any]) -> None:
        self.calls.append("replace")
        self.items[name] = copy.deepcopy(body)

    def delete_slice(self, name: str) -> None:
        self.calls.append(f"delete {name}")
        del self.items[name]


def test_publish_creates_then_bumps_generation_on_health_change() -> None:
    api, live = Slices(), LiveInventory(Inventory(GPUS, 4))
    assert publish_once(api, "n1", live, no_uid) == "created"
    assert publish_once(api, "n1", live, no_uid) == "unchanged"
    live.set_health("GPU-a", False, "XID 48")
    assert publish_once(api, "n1", live, no_uid) == "replaced"
    spec = api.items[slice_name("n1")]["spec"]
    assert spec["pool"]["generation"] == 2
    assert "taints" in spec["devices"][0]


def test_publish_after_the_kubelet_deleted_the_slice_creates_it_again() -> None:
    api, live = Slices(), LiveInventory(Inventory(GPUS, 4))
    publish_once(api, "n1", live, no_uid)
    api.items.clear()  # the kubelet deletes its node's slices when it starts
    assert publish_once(api, "n1", live, no_uid) == "created"


def test_publish_removes_only_its_own_stale_slices() -> None:
    api, live = Slices(), LiveInventory(Inventory(GPUS, 4))
    api.items["n1-old-name"] = {"metadata": {"name": "n1-old-name"}, "spec": {}}
    publish_once(api, "n1", live, no_uid)
    assert api.calls == ["delete n1-old-name", "create"]


def test_each_write_is_owned_by_the_node_uid_read_for_it() -> None:
    api, live, uids = Slices(), LiveInventory(Inventory(GPUS, 4)), iter(["u1", "u2"])
    publish_once(api, "n1", live, lambda: next(uids))
    assert publish_once(api, "n1", live, unasked) == "unchanged"
    live.set_health("GPU-a", False, "XID 79")
    publish_once(api, "n1", live, lambda: next(uids))
    assert api.items[slice_name("n1")]["metadata"]["ownerReferences"][0]["uid"] == "u2"


def test_capacities_are_compared_as_quantities() -> None:
    wanted = resource_slice("n1", Inventory((NodeGpu("GPU-a", 0, "Fake", 16000),), 4), 1)
    current = copy.deepcopy(wanted)
    memory = current["spec"]["devices"][0]["capacity"]["memory"]
    memory["value"] = "67108864k"  # 4 x 16000 MiB, as the API server writes it back
    memory["requestPolicy"]["validRange"]["max"] = "16000Mi"
    assert same_devices(current, wanted)
    memory["value"] = "67108865k"
    assert not same_devices(current, wanted)


class StampingSlices(Slices):
    """Slices as the real API server keeps them: it stamps `timeAdded` on every device taint
    that has none, at each create and update."""

    def __init__(self) -> None:
        super().__init__()
        self.stamps = 0

    def _stamped(self, body: dict[str, Any]) -> dict[str, Any]:
        for device in body["spec"]["devices"]:
            for taint in device.get("taints") or []:
                if "timeAdded" not in taint:
                    self.stamps += 1
                    taint["timeAdded"] = f"2026-12-01T00:00:{self.stamps:02d}Z"
        return body

    def create_slice(self, body: dict[str, Any]) -> None:
        super().create_slice(self._stamped(copy.deepcopy(body)))

    def replace_slice(self, name: str, body: dict[str, Any]) -> None:
        super().replace_slice(name, self._stamped(copy.deepcopy(body)))


def test_a_tainted_slice_is_not_replaced_again_while_nothing_changes() -> None:
    api, live = StampingSlices(), LiveInventory(Inventory(GPUS, 4))
    publish_once(api, "n1", live, no_uid)
    live.set_health("GPU-a", False, "XID 79")
    assert publish_once(api, "n1", live, no_uid) == "replaced"
    # The resync every 10 s: nothing changed, so nothing is written (no new generation, and
    # the taint keeps the time it was added).
    assert publish_once(api, "n1", live, no_uid) == "unchanged"
    assert publish_once(api, "n1", live, no_uid) == "unchanged"
    spec = api.items[slice_name("n1")]["spec"]
    assert spec["pool"]["generation"] == 2
    assert spec["devices"][0]["taints"][0]["timeAdded"] == "2026-12-01T00:00:01Z"
    live.set_health("GPU-a", True)
    assert publish_once(api, "n1", live, no_uid) == "replaced"
    assert "taints" not in api.items[slice_name("n1")]["spec"]["devices"][0]
