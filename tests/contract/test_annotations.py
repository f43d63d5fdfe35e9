"""Each `baton.dev/*` annotation has one codec; the wire format is as it was."""

from __future__ import annotations

import pytest

from baton.contract import annotations as codec
from baton.contract.annotations import AnnotationError, GpuRecord
from baton.contract.names import (
    ANNOTATION_ALLOCATED_AT,
    ANNOTATION_ASSIGNED_AT,
    ANNOTATION_ASSIGNED_GPUS,
    ANNOTATION_CONTAINER_GPUS,
    ANNOTATION_GPUS,
    ANNOTATION_HOST_MEMORY_BUDGET,
)

GPUS = (GpuRecord("GPU-a", 0, "H100", 81920, 4), GpuRecord("GPU-b", 1, "H100", 81920, 4, False))


def test_the_node_inventory_is_written_as_before_and_read_back() -> None:
    notes = codec.node_annotations(GPUS, 65536)
    assert notes == {
        ANNOTATION_GPUS: '[{"uuid":"GPU-a","index":0,"model":"H100","memoryMiB":81920,"slots":4,'
        '"healthy":true},{"uuid":"GPU-b","index":1,"model":"H100","memoryMiB":81920,"slots":4,'
        '"healthy":false}]',
        ANNOTATION_HOST_MEMORY_BUDGET: "65536",
    }
    assert codec.decode_gpus(notes[ANNOTATION_GPUS]) == GPUS
    assert codec.decode_budget(notes[ANNOTATION_HOST_MEMORY_BUDGET]) == 65536
    assert codec.decode_gpus(None) == () and codec.decode_budget(None) == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "baton.dev/gpus is unreadable"),
        ('{"uuid": "x"}', "baton.dev/gpus is unreadable: not a list"),
        ('[{"uuid":"x","index":0,"memoryMiB":1,"slots":0}]', "has memoryMiB 1, slots 0"),
        ('[{"uuid":"x","index":0,"memoryMiB":1e999,"slots":4}]', "unreadable: cannot convert"),
        ('[{"uuid":"x","index":-1e999,"memoryMiB":1,"slots":4}]', "unreadable: cannot convert"),
    ],
)
def test_an_unreadable_inventory_names_the_annotation(text: str, message: str) -> None:
    with pytest.raises(AnnotationError, match=message):
        codec.decode_gpus(text)


@pytest.mark.parametrize(
    ("text", "message"), [("lots", "'lots' is not a number of MiB"), ("-1", "-1 is negative")]
)
def test_an_unreadable_budget_names_the_annotation(text: str, message: str) -> None:
    with pytest.raises(AnnotationError, match=f"{ANNOTATION_HOST_MEMORY_BUDGET} {message}"):
        codec.decode_budget(text)


def test_a_pods_annotations_are_written_and_read_back() -> None:
    at = 1_767_225_600_123_456_789
    notes = {
        **codec.assignment_annotations(("GPU-b", "GPU-a"), at),
        ANNOTATION_ALLOCATED_AT: codec.encode_timestamp(at + 1),
        ANNOTATION_CONTAINER_GPUS: codec.encode_container_gpus({"m": ("GPU-a",), "b": ("GPU-b",)}),
    }
    assert notes[ANNOTATION_ASSIGNED_GPUS] == "GPU-b,GPU-a"
    assert notes[ANNOTATION_ASSIGNED_AT] == "2026-01-01T00:00:00.123456789Z"
    assert notes[ANNOTATION_CONTAINER_GPUS] == '{"b":["GPU-b"],"m":["GPU-a"]}'
    assert codec.pod_assignment(notes) == codec.PodAssignment(
        assigned_gpus=("GPU-b", "GPU-a"),
        assigned_at_ns=at,
        allocated_at_ns=at + 1,
        allocated=True,
        container_gpus={"b": ("GPU-b",), "m": ("GPU-a",)},
    )


def test_missing_or_malformed_pod_annotations_read_as_nothing() -> None:
    assert codec.pod_assignment({}) == codec.PodAssignment()
    odd = {
        ANNOTATION_ASSIGNED_GPUS: " GPU-a , ,GPU-b",
        ANNOTATION_ASSIGNED_AT: "yesterday",
        ANNOTATION_CONTAINER_GPUS: "[1]",
    }
    read = codec.pod_assignment(odd)
    assert read.assigned_gpus == ("GPU-a", "GPU-b")
    assert (read.assigned_at_ns, read.container_gpus, read.allocated) == (None, {}, False)
