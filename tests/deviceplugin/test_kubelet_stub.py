"""The kubelet stub refuses registrations the way the kubelet does."""

from __future__ import annotations

import grpc
import pytest

from baton._pb import api_pb2, api_pb2_grpc
from baton.contract import names
from tests.harness.kubeletplugin import is_extended_resource_name


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("baton.dev/gpu", True),
        ("example.com/resource", True),
        ("gpu", False),
        ("kubernetes.io/gpu", False),
        ("node.kubernetes.io/gpu", False),
        ("requests.baton.dev/gpu", False),
        ("Baton.dev/gpu", False),
        ("baton.dev/" + "g" * 64, False),
    ],
)
def test_extended_resource_names(name, ok):
    assert is_extended_resource_name(name) is ok


@pytest.mark.parametrize(
    ("version", "resource", "endpoint", "refusal"),
    [
        (
            "v1alpha",
            names.RESOURCE_GPU,
            "p.sock",
            "requested API version 'v1alpha' is not supported",
        ),
        ("v1beta1", "gpu", "p.sock", "the ResourceName 'gpu' is invalid"),
        ("v1beta1", names.RESOURCE_GPU, "../p.sock", "must be a socket name"),
        ("v1beta1", names.RESOURCE_GPU, "absent.sock", "failed to dial device plugin"),
    ],
)
def test_refuses_bad_registrations(kubelet, socket_dir, version, resource, endpoint, refusal):
    request = api_pb2.RegisterRequest(version=version, endpoint=endpoint, resource_name=resource)
    target = f"unix://{socket_dir / 'kubelet.sock'}"
    with grpc.insecure_channel(target) as channel, pytest.raises(grpc.RpcError) as refused:
        api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=5)
    assert refusal in refused.value.details()
    assert kubelet.registrations == []
