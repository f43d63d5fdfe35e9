"""The kubelet restarts (stub) while a GPU is unhealthy: the plugin comes back the same."""

from __future__ import annotations

import time

import pytest

from baton.contract import names
from tests.deviceplugin.test_kubelet_flow import GPU1, post

from .figures import record

pytestmark = pytest.mark.timeout(60)


def test_after_each_kubelet_restart_it_reregisters_within_2_s_with_an_identical_list(
    kubelet, start_plugin
):
    """Promised: after a kubelet restart the plugin registers again within 2 s and lists the
    very same devices with the very same health (an unhealthy GPU stays unhealthy)."""
    daemon = start_plugin()
    kubelet.wait_for_registrations(1)
    kubelet.wait_for_list(names.RESOURCE_GPU, lambda devs: bool(devs))
    post(daemon, "/fake/xid", {"gpu": GPU1, "xid": 79})
    before = kubelet.wait_for_list(names.RESOURCE_GPU, lambda devs: "Unhealthy" in devs.values())
    took: list[float] = []
    lists_identical = 0
    for restart in range(3):
        began = time.monotonic()
        kubelet.restart()
        kubelet.wait_for_registrations(2 + restart, timeout=2.0)
        took.append(time.monotonic() - began)
        after = kubelet.wait_for_list(names.RESOURCE_GPU, lambda devs: bool(devs))
        assert after == before
        lists_identical += 1
    assert max(took) < 2.0
    figures = {
        "restarts": len(took),
        "lists_identical": lists_identical,
        "devices": len(before),
        "slowest_reregistration_s": round(max(took), 3),
    }
    record("faults", f"kubelet restarted {len(took)} times", figures)
