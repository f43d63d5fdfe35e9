"""Fake GPUs declared in a file: each one a GPU the slice, the annotation and the agent can use."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodegpu.gpus import DiscoveryError, parse_fake_gpus


@pytest.mark.parametrize(
    ("entries", "problem"),
    [
        ("- {memoryMiB: 0}\n", "entry 0 needs a memoryMiB that is an integer above 0"),
        ("- {memoryMiB: 1024}\n- {memoryMiB: -1}\n", "entry 1 needs a memoryMiB"),
        ("- {memoryMiB: true}\n", "entry 0 needs a memoryMiB"),
        ("- {memoryMiB: '1024'}\n", "entry 0 needs a memoryMiB"),
        ("- 1024\n", "entry 0 needs a memoryMiB"),
        (
            "- {memoryMiB: 1024, uuid: GPU-x}\n- {memoryMiB: 1024, uuid: GPU-x}\n",
            "entries 0 and 1 have the same uuid GPU-x",
        ),
    ],
)
def test_a_fake_gpu_file_entry_no_gpu_could_have_is_refused(
    tmp_path: Path, entries: str, problem: str
) -> None:
    """Accepted, a GPU of no memory publishes a device no claim fits, and two GPUs of one UUID
    share their health and their tenants."""
    path = tmp_path / "gpus.yaml"
    path.write_text(entries)
    with pytest.raises(DiscoveryError) as refused:
        parse_fake_gpus(str(path), "node-a")
    assert problem in str(refused.value) and str(path) in str(refused.value)
