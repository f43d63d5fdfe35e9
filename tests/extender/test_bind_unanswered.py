"""A bind against an API server that stops answering: kube-scheduler waits `httpTimeout` for the
extender's bind (5 s in every scheduler configuration Baton ships), so the extender must answer
before that, with the reason, or kube-scheduler only reports its own timeout."""

from __future__ import annotations

import time
from typing import Any

from extender.bind import Binder
from extender.cache import KubeCache
from extender.kubeapi import KubePodApi
from extender.wire import BindingArgs
from tests.extender.binding import bind_once
from tests.extender.builders import node, pod
from tests.extender.conftest import SYNC_TIMEOUT_S
from tests.harness.fakeapi import FakeApiServer

SCHEDULER_HTTP_TIMEOUT_S = 5.0


def test_a_bind_whose_pod_read_is_not_answered_fails_before_kube_scheduler_gives_up(
    fake_api: FakeApiServer, kube_cache: KubeCache, api_client: Any
) -> None:
    """After a conflict the bind reads the pod afresh; that read, retried three times by the
    client's default, took four of its 1.5 s timeouts: 6 s, past kube-scheduler's 5 s."""
    fake_api.put_object(node("gpu-1", gpus=2, slots=1))
    p = fake_api.put_object(pod("trainer"))
    uid = p["metadata"]["uid"]
    # the node and the pod come by watches of their own: both known before the bind
    known = lambda s: s.node("gpu-1") is not None and s.pending_pod(uid) is not None  # noqa: E731
    assert kube_cache.wait_for(known, SYNC_TIMEOUT_S)
    fake_api.fail_next("create", "pods/binding", 409, message="the object has been modified")
    fake_api.hang_next("get", "pods", times=4)
    binder = Binder(kube_cache, KubePodApi(api_client), time.time_ns)
    began = time.monotonic()
    try:
        error = bind_once(binder, BindingArgs("trainer", "default", uid, "gpu-1"))
    finally:
        fake_api.release_hangs()
    took = time.monotonic() - began
    assert error.startswith("binding pod default/trainer to gpu-1: reading pod"), error
    assert "API server unreachable" in error, error
    assert len(fake_api.requests("get", "pods")) == 1, "the pod read was retried"
    assert took < SCHEDULER_HTTP_TIMEOUT_S, f"the bind answered after {took:.1f} s"
