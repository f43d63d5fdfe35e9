"""The protobuf Binding, read back by the fake API server's independent decoder."""

from __future__ import annotations

import pytest

from extender import kubeproto
from tests.harness.kubeprotobuf import read_binding
from tests.harness.kuberules import ApiError


def test_a_binding_reads_back_as_its_json_form() -> None:
    notes = {"baton.dev/assigned-gpus": "GPU-a,GPU-b", "long": "x" * 300}
    raw = kubeproto.binding("ns", "pod-1", "node-7", "uid-1", "42", notes)
    assert raw.startswith(b"k8s\x00")
    assert read_binding(raw) == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": "pod-1",
            "namespace": "ns",
            "uid": "uid-1",
            "resourceVersion": "42",
            "annotations": notes,
        },
        "target": {"kind": "Node", "name": "node-7", "apiVersion": "v1"},
    }


def test_preconditions_and_annotations_are_left_out_when_not_given() -> None:
    meta = read_binding(kubeproto.binding("ns", "p", "n"))["metadata"]
    assert meta == {"name": "p", "namespace": "ns"}


def test_the_stand_in_refuses_what_is_not_a_protobuf_binding() -> None:
    with pytest.raises(ApiError, match="prefix"):
        read_binding(b'{"kind": "Binding"}')
    same_length_kind = kubeproto.binding("ns", "p", "n").replace(b"Binding", b"Service")
    with pytest.raises(ApiError, match="only Bindings") as refused:
        read_binding(same_length_kind)
    assert refused.value.code == 415
    with pytest.raises(ApiError, match="unreadable"):
        read_binding(kubeproto.binding("ns", "p", "n")[:-3])
