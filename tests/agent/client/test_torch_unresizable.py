"""TorchParker and storages that cannot be resized (memory-mapped weights, as `from_pretrained`
loads them on the CPU): copied once at registration, or refused at park with the reason."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")


def mapped_linear(tmp_path: Path):
    """A Linear whose weight and bias are views of one memory-mapped file."""
    import torch

    path = tmp_path / "weights.bin"
    path.write_bytes(struct.pack("20f", *range(20)))
    flat = torch.from_file(str(path), shared=False, size=20, dtype=torch.float32)
    model = torch.nn.Linear(4, 4)
    with torch.no_grad():
        model.weight.set_(flat.untyped_storage(), 0, (4, 4), (4, 1))
        model.bias.set_(flat.untyped_storage(), 16, (4,), (1,))
    assert not model.weight.untyped_storage().resizable()
    return model


def test_mapped_weights_are_copied_once_at_registration_and_park(tmp_path: Path) -> None:
    import torch

    from agent.client.torch import TorchParker

    model = mapped_linear(tmp_path)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    parker = TorchParker(model, optimizer)
    assert parker.stats.copied_bytes == 80  # one storage behind both, copied once
    assert model.weight.untyped_storage().data_ptr() == model.bias.untyped_storage().data_ptr()
    assert all(p.untyped_storage().resizable() for p in model.parameters())
    assert optimizer.param_groups[0]["params"][0] is model.weight  # the same Parameter
    assert parker.park("gpu") == 80
    parker.restore("gpu")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()  # still trains
    assert not torch.equal(before[1], model.bias)


def test_a_storage_pinned_after_registration_is_copied_at_the_next_park(tmp_path: Path) -> None:
    import torch

    from agent.client.torch import TorchParker

    model = torch.nn.Linear(4, 4)
    parker = TorchParker(model)
    assert parker.stats.copied_bytes == 0
    model.weight.detach().numpy()  # a numpy view pins the storage's size, as a digest may
    assert not model.weight.untyped_storage().resizable()
    weight = model.weight.detach().clone()
    assert parker.park("gpu") == 80 and parker.stats.copied_bytes == 64
    parker.restore("gpu")
    assert torch.equal(model.weight, weight)


def test_a_parker_with_nothing_yet_parks_and_restores_nothing() -> None:
    from agent.client.torch import TorchParker

    parker = TorchParker()  # e.g. parked before the trainer built its model
    assert parker.park("gpu") == 0 and parker.parked
    assert parker.restore("gpu") == 0 and not parker.parked


def test_a_storage_in_shared_memory_is_refused_at_park_and_left_intact() -> None:
    """torch resizes a shared-memory storage to 0 but crashes the process resizing it back: a
    park refuses it (before anything moves) rather than crash the restore."""
    import torch

    from agent.client.parked_tensors import ParkError
    from agent.client.torch import TorchParker

    model = torch.nn.Linear(4, 4)
    model.share_memory()
    before = [p.detach().clone() for p in model.parameters()]
    parker = TorchParker(model)
    with pytest.raises(ParkError, match=r"2 storages \(80 bytes\) are in shared memory"):
        parker.park("gpu")
    assert not parker.parked
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert model.weight.untyped_storage().is_shared()


def test_overlapping_numpy_slices_share_one_copy_and_still_alias() -> None:
    """Tensors over slices of one numpy array (`from_numpy` gives each its own storage, at its
    own address): copied one by one, the shorter first made registering the longer raise torch's
    `setStorage: ... out of bounds` traceback, and overlapping ones no longer saw each other's
    writes."""
    import numpy as np
    import torch

    from agent.client.torch import TorchParker

    array = np.arange(12, dtype=np.float32)
    head, whole, tail = (
        torch.from_numpy(array[s]) for s in (slice(0, 5), slice(None), slice(4, 8))
    )
    parker = TorchParker([head, whole, tail])
    assert parker.stats.copied_bytes == 48  # the memory they span, once
    assert parker.park("gpu") == 48
    parker.restore("gpu")
    assert whole.tolist() == list(range(12))
    head[4] = 100.0
    assert whole[4] == 100.0 and tail[0] == 100.0  # one memory still
