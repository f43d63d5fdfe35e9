"""The plugin against the kubelet stub over real unix sockets: registration, lists, health,
kubelet restarts."""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from baton.contract import names
from baton.contract.names import fake_gpu_uuid
from deviceplugin import plugin as plugin_module
from deviceplugin.watcher import Change
from tests.deviceplugin.conftest import NODE
from tests.deviceplugin.test_watcher import overflow
from tests.e2e.processes import poll
from tests.harness.kubeletplugin import RegistrationServer
from tests.harness.podresources import ContainerAsk

GPU0, GPU1 = fake_gpu_uuid(0, NODE), fake_gpu_uuid(1, NODE)


def post(daemon, path, body):
    request = urllib.request.Request(
        f"http://127.0.0.1:{daemon.status.port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def test_registers_resource_after_serving(kubelet, start_plugin):
    start_plugin()
    request = kubelet.wait_for_registrations(1)
    assert request.version == "v1beta1"
    assert request.resource_name == names.RESOURCE_GPU
    assert request.endpoint == names.DEVICE_PLUGIN_SOCKET_NAME
    assert kubelet.endpoint(names.RESOURCE_GPU).options.get_preferred_allocation_available


def test_list_and_watch_sends_every_slot_at_once(kubelet, start_plugin):
    start_plugin(slots=3)
    kubelet.wait_for_registrations(1)
    devices = kubelet.wait_for_list(names.RESOURCE_GPU, lambda devs: bool(devs))
    want = {names.slot_device_id(g, s) for g in (GPU0, GPU1) for s in range(3)}
    assert set(devices) == want
    assert set(devices.values()) == {"Healthy"}


def test_fake_xid_turns_that_gpus_slots_unhealthy(kubelet, start_plugin):
    daemon = start_plugin()
    kubelet.wait_for_registrations(1)
    endpoint = kubelet.endpoint(names.RESOURCE_GPU)
    endpoint.wait_for_list(lambda devs: bool(devs))

    assert post(daemon, "/fake/xid", {"gpu": "1", "xid": 43}) == {"gpu": GPU1, "changed": False}
    assert post(daemon, "/fake/xid", {"gpu": GPU1, "xid": 79}) == {"gpu": GPU1, "changed": True}
    devices = endpoint.wait_for_list(lambda devs: "Unhealthy" in devs.values())
    assert {d for d, h in devices.items() if h == "Unhealthy"} == {
        names.slot_device_id(GPU1, s) for s in range(4)
    }
    assert len(endpoint.lists) == 2, "an ignored XID must not resend the list"
    assert kubelet.free_devices(names.RESOURCE_GPU) == sorted(
        names.slot_device_id(GPU0, s) for s in range(4)
    )

    post(daemon, "/fake/recover", {"gpu": GPU1})
    endpoint.wait_for_list(lambda devs: set(devs.values()) == {"Healthy"})


def test_reregisters_within_two_seconds_after_kubelet_restart(kubelet, start_plugin):
    daemon = start_plugin()
    kubelet.wait_for_registrations(1)
    post(daemon, "/fake/xid", {"gpu": GPU1, "xid": 79})
    for _ in range(3):
        kubelet.restart()
        registered = kubelet.wait_for_registration_after(kubelet.restarted_at, timeout=5.0)
        assert registered - kubelet.restarted_at < 2.0
        devices = kubelet.wait_for_list(names.RESOURCE_GPU, bool)
        assert len(devices) == 8
        assert sorted(devices.values()) == ["Healthy"] * 4 + ["Unhealthy"] * 4


def test_reregisters_when_its_own_socket_is_deleted(kubelet, start_plugin, socket_dir):
    start_plugin()
    kubelet.wait_for_registrations(1)
    (socket_dir / names.DEVICE_PLUGIN_SOCKET_NAME).unlink()
    kubelet.wait_for_registrations(2, timeout=2.0)
    assert (socket_dir / names.DEVICE_PLUGIN_SOCKET_NAME).is_socket()


def test_registers_again_when_the_kubelet_drops_its_stream(kubelet, start_plugin):
    """The real kubelet can drop a plugin's newest registration (an older one's stream ending
    after it); the plugin sees its stream closed and registers again."""
    start_plugin()
    kubelet.wait_for_registrations(1)
    kubelet.drop(names.RESOURCE_GPU)
    kubelet.wait_for_registrations(2, timeout=5.0)
    assert len(kubelet.wait_for_list(names.RESOURCE_GPU, bool)) == 8


def test_a_second_notice_of_the_same_kubelet_restarts_nothing(kubelet, start_plugin, socket_dir):
    """A kubelet's start deletes the plugin's socket and creates kubelet.sock; seen as two
    changes, the second must not restart the server: a restart ends the stream the kubelet
    just opened, and the kubelet then drops the registration that replaced it."""
    daemon = start_plugin()
    kubelet.wait_for_registrations(1)
    (socket_dir / names.DEVICE_PLUGIN_SOCKET_NAME).unlink()
    kubelet.wait_for_registrations(2, timeout=2.0)
    endpoint = kubelet.endpoint(names.RESOURCE_GPU)
    daemon.plugin._react([Change.KUBELET_SOCKET_CREATED], False)  # the second notice
    assert len(kubelet.registrations) == 2 and not endpoint.ended.is_set()
    kubelet.restart()  # a kubelet.sock of a new kubelet: registered again
    kubelet.wait_for_registrations(3, timeout=5.0)


def test_registers_once_the_kubelet_appears(socket_dir, start_plugin):
    from tests.harness.kubelet import KubeletStub

    daemon = start_plugin()
    assert not daemon.plugin.registered
    with pytest.raises(urllib.error.HTTPError) as unready:
        urllib.request.urlopen(f"http://127.0.0.1:{daemon.status.port}/readyz", timeout=5)
    assert unready.value.code == 503
    assert "not registered with the kubelet" in unready.value.read().decode()
    late = KubeletStub(socket_dir)
    late.start()
    try:
        late.wait_for_registrations(1, timeout=2.0)
    finally:
        late.stop()


def test_the_kubelet_registered_with_is_the_one_that_answered(
    kubelet, start_plugin, socket_dir, monkeypatch, caplog
):
    """A new kubelet can create its kubelet.sock between the plugin's look at the socket and its
    registration, which then reaches the new kubelet. That socket's notice must not restart the
    server: a restart ends the stream the new kubelet just opened, and the kubelet's late
    disconnect of that client marks the registration after it unhealthy (capacity 8,
    allocatable 0: the real-node kubelet-restart flake)."""
    caplog.set_level(logging.INFO, logger="deviceplugin.plugin")
    daemon = start_plugin()
    kubelet.wait_for_registrations(1)
    real_register = plugin_module.register

    def a_new_kubelet_meanwhile(*args: Any) -> None:
        monkeypatch.setattr(plugin_module, "register", real_register)
        kubelet.registration.stop()
        kubelet.registration.socket_path.unlink(missing_ok=True)
        kubelet.registration = RegistrationServer(socket_dir, kubelet._on_register)
        kubelet.registration.start()
        real_register(*args)

    monkeypatch.setattr(plugin_module, "register", a_new_kubelet_meanwhile)
    kubelet.drop(names.RESOURCE_GPU)  # the plugin registers again, and meets the new kubelet
    kubelet.wait_for_registrations(2, timeout=5.0)
    endpoint = kubelet.endpoint(names.RESOURCE_GPU)
    poll(
        "the plugin's notice of the new kubelet.sock",
        lambda: "already registered there" in caplog.text or "restarting" in caplog.text or None,
        timeout=5.0,
    )
    assert "restarting the plugin server" not in caplog.text
    assert len(kubelet.registrations) == 2 and not endpoint.ended.is_set()
    assert daemon.plugin.registered


def test_a_stream_the_kubelet_ends_while_the_plugin_registers_registers_it_again(
    kubelet, start_plugin, monkeypatch
):
    """The kubelet may end the new registration's stream before the registering thread goes on
    (a kubelet restarting, a loaded node). That end must not be forgotten: the plugin would stay
    listed as registered with no stream, and the node would advertise no GPUs."""
    told = threading.Event()
    on_stream_end = plugin_module.DevicePlugin._on_stream_end

    def stream_ended(plugin: Any) -> None:
        on_stream_end(plugin)
        told.set()

    real_register = plugin_module.register

    def dropped_at_once(*args: Any) -> None:
        monkeypatch.setattr(plugin_module, "register", real_register)
        real_register(*args)
        kubelet.endpoint(names.RESOURCE_GPU).wait_for_list(lambda devs: bool(devs))
        kubelet.drop(names.RESOURCE_GPU)  # before the plugin's thread returns from registering
        assert told.wait(5.0), "the plugin never heard its stream end"

    monkeypatch.setattr(plugin_module.DevicePlugin, "_on_stream_end", stream_ended)
    monkeypatch.setattr(plugin_module, "register", dropped_at_once)
    daemon = start_plugin()
    kubelet.wait_for_registrations(2, timeout=5.0)
    poll("registered again", lambda: daemon.plugin.registered or None, timeout=5.0)


def test_relative_socket_paths_are_taken_from_the_working_directory(
    kubelet, start_plugin, socket_dir, monkeypatch
):
    """`--device-plugin-dir .` and `--pod-resources-socket pod-resources/kubelet.sock`, run
    from the kubelet's directory: the plugin registers and reads the pod resources there, as a
    unix socket's relative path is found, rather than gRPC refusing both targets ('the target
    uri is not valid') at every registration and reconciliation."""
    monkeypatch.chdir(socket_dir)
    daemon = start_plugin(
        plugin_dir=Path("."), pod_resources_socket=Path("pod-resources/kubelet.sock")
    )
    kubelet.wait_for_registrations(1, timeout=10)
    kubelet.wait_for_list(names.RESOURCE_GPU, bool)
    pod = kubelet.admit_pod("default", "tenant", [ContainerAsk("main", 1)], [])
    assert daemon.pod_resources is not None
    assert daemon.pod_resources.list() == {
        ("default", "tenant"): {"main": tuple(pod.devices["main"])}
    }


def test_registers_again_after_a_kubelet_restart_whose_events_were_lost(
    kubelet, start_plugin, socket_dir
):
    """The kubelet restarts while the watch's inotify queue is full: neither its new
    kubelet.sock nor the deletion of the plugin's socket makes an event. Ignoring the overflow,
    the plugin only saw its stream end and registered again and again with its socket gone,
    refused each time ("no socket at ..."): the node's GPUs were never advertised again."""
    daemon = start_plugin()
    kubelet.wait_for_registrations(1)
    plugin = daemon.plugin
    plugin._stop.set()  # hold the watch so that its queue fills: the events of the restart
    plugin._watcher.wake()  # are lost, as they are when the plugin falls behind
    plugin._thread.join(timeout=10)
    assert not plugin._thread.is_alive()
    plugin._stop.clear()
    overflow(socket_dir)
    kubelet.restart()
    plugin._thread = threading.Thread(target=plugin._run, name="kubelet-watch", daemon=True)
    plugin._thread.start()
    kubelet.wait_for_registrations(2, timeout=5.0)
    assert len(kubelet.wait_for_list(names.RESOURCE_GPU, bool)) == 8


def test_a_stream_end_seen_with_a_notice_of_the_same_kubelet_registers_again(
    kubelet, start_plugin, monkeypatch
):
    """The kubelet drops the plugin's stream, and its wake arrives with the (late) notice of
    the kubelet.sock the plugin is registered with already, in one batch. The notice restarts
    nothing, but the stream's end must still be seen: left for a next change that may never
    come, the node advertised no GPUs."""
    daemon = start_plugin()
    kubelet.wait_for_registrations(1)
    plugin = daemon.plugin
    watcher = plugin._watcher
    real_changes = watcher.changes
    waiting, noticed = threading.Event(), threading.Event()

    def with_the_notice(timeout: float | None = None) -> Any:
        waiting.set()
        found = list(real_changes(timeout))
        if plugin._stream_lost.is_set() and not noticed.is_set():
            noticed.set()
            found.append(Change.KUBELET_SOCKET_CREATED)  # the kubelet.sock it serves
        return iter(found)

    monkeypatch.setattr(watcher, "changes", with_the_notice)
    watcher.wake()  # the watch loop's next wait is the one above
    assert waiting.wait(5.0), "the watch loop did not wait again"
    kubelet.drop(names.RESOURCE_GPU)
    kubelet.wait_for_registrations(2, timeout=5.0)
    assert noticed.is_set()
    assert len(kubelet.wait_for_list(names.RESOURCE_GPU, bool)) == 8
