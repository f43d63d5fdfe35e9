"""What TorchParker takes to park: a cache held as a list or dict of tensors (as the module's
example passes `sampler.cache`) is parked as it is at each park; anything else is refused as it
is registered, naming it (a list or a `None` reference model failed with "object is not
callable")."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")


def test_a_list_or_dict_of_tensors_is_parked_as_it_is_at_each_park() -> None:
    import torch

    from agent.client.torch import TorchParker

    cache: dict[str, Any] = {"keys": [torch.ones(4)], "values": torch.arange(4.0)}
    history = [torch.full((2,), 7.0)]
    parker = TorchParker(cache, history)
    cache["later"] = torch.zeros(8)  # filled in after registration, in place
    assert parker.park("gpu") == (4 + 4 + 2 + 8) * 4
    assert all(t.untyped_storage().nbytes() == 0 for t in (cache["later"], history[0]))
    assert parker.restore("gpu") == 72
    assert torch.equal(cache["values"], torch.arange(4.0)) and history[0].tolist() == [7.0, 7.0]


@pytest.mark.parametrize("source", [None, "model", 3])
def test_what_is_no_source_is_refused_as_it_is_registered_naming_it(source: object) -> None:
    import torch

    from agent.client.torch import TorchParker

    model = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError) as raised:
        TorchParker(model, source)  # type: ignore[arg-type]
    assert str(raised.value) == (
        f"TorchParker cannot park a {type(source).__name__} (source 2): pass modules,"
        " optimizers, tensors, lists or dicts of tensors, or a function returning tensors"
    )
    parker = TorchParker(model)
    with pytest.raises(TypeError, match="cannot park a NoneType"):
        parker.add(None)  # type: ignore[arg-type]
    assert parker.sources == [model]


def test_an_optimizer_dropped_after_a_park_and_restore_frees_its_memory() -> None:
    """`BatonCallback.watch` parks an optimizer only while the program keeps it (an SFT stage's,
    before a GRPO stage): once parked and restored, dropping it must free its state's storages,
    not leave them allocated on the device until some later park."""
    import functools
    import gc
    import weakref

    import torch
    from torch.multiprocessing.reductions import StorageWeakRef

    from agent.client.torch import TorchParker
    from agent.client.trl import _tensors_while_kept

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    parker = TorchParker(model)
    parker.add(functools.partial(_tensors_while_kept, weakref.ref(optimizer)))
    state = [
        StorageWeakRef(t.untyped_storage()) for s in optimizer.state.values() for t in s.values()
    ]
    assert parker.park("gpu") > 0 and parker.restore("gpu") > 0
    del optimizer
    gc.collect()
    assert sum(not ref.expired() for ref in state) == 0
    weight = model.weight.detach().clone()
    assert parker.park("gpu") == parker.restore("gpu") == (6 + 2) * 4 * 2  # weights and grads
    assert torch.equal(model.weight, weight)


def test_sparse_gradients_are_parked_and_train_bit_for_bit_as_alone() -> None:
    """`nn.Embedding(sparse=True)` leaves a sparse COO gradient, whose storage torch will not
    hand out: every park failed ("Cannot access storage of SparseTensorImpl"), so such a job
    could never be parked. Its indices and values are parked with the rest."""
    import torch

    from agent.client.torch import TorchParker

    def trained(parker_for: Any) -> list[Any]:
        torch.manual_seed(0)
        model = torch.nn.Embedding(16, 4, sparse=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        parker = parker_for(model, optimizer)
        for step in range(3):
            model(torch.tensor([step, 5, step + 7])).sum().backward()
            if parker is not None:  # parked between the backward and the step
                grad = model.weight.grad
                assert grad is not None and grad.layout == torch.sparse_coo
                values = grad._values()
                # the weights, the gradient's 3 rows (indices and values), and as many rows per
                # step before in SGD's momentum buffer (sparse too)
                assert parker.park("gpu") == 16 * 4 * 4 + (1 + step) * (3 * 8 + 3 * 4 * 4)
                assert values.untyped_storage().nbytes() == 0
                assert "parked by Baton" in repr(grad)
                assert parker.restore("gpu") > 0
            optimizer.step()
            optimizer.zero_grad()
        momentum = optimizer.state[model.weight]["momentum_buffer"]
        return [model.weight.detach().clone(), momentum.to_dense()]

    alone = trained(lambda *_: None)
    parked = trained(TorchParker)
    assert all(torch.equal(a, b) for a, b in zip(alone, parked, strict=True))


@pytest.mark.parametrize("how", ["list", "dict", "function"])
def test_modules_and_optimizers_inside_a_list_a_dict_or_a_function_are_parked(how: str) -> None:
    """`TorchParker([policy, ref_model])` took the list and parked nothing of the models in it:
    the park answered 0 bytes, the agent counted the room made, and the models stayed on the
    device beside the job it made room for."""
    import torch

    from agent.client.torch import TorchParker

    policy, reference = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.1, momentum=0.9)
    policy(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    before = [t.detach().clone() for t in (policy.weight, reference.weight)]
    items = [policy, reference, optimizer]
    sources = {"list": items, "dict": dict(enumerate(items)), "function": lambda: items}
    parker = TorchParker(sources[how])  # type: ignore[arg-type]
    weights, grads, momentum = (20 + 10) * 4, 20 * 4, 20 * 4
    assert parker.park("gpu") == weights + grads + momentum
    assert all(p.untyped_storage().nbytes() == 0 for p in (policy.weight, reference.bias))
    assert parker.restore("gpu") == weights + grads + momentum
    after = (policy.weight, reference.weight)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_a_meta_tensor_holds_no_memory_and_is_left_out_of_the_park() -> None:
    """A submodule on the meta device (initialised lazily, or offloaded) has no bytes to move:
    every park with `device=None` (the TRL callback's parker) failed on it, "Cannot copy out of
    meta tensor", and the footprint counted its bytes."""
    import torch

    from agent.client.torch import TorchParker

    real, lazy = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4, device="meta")
    before = real.weight.detach().clone()
    parker = TorchParker(torch.nn.Sequential(real, lazy))
    assert parker.footprint_bytes() == (16 + 4) * 4
    assert parker.park("gpu") == 80
    assert real.weight.untyped_storage().nbytes() == 0 and lazy.weight.is_meta
    assert parker.restore("gpu") == 80
    assert torch.equal(real.weight, before) and lazy.weight.is_meta


@pytest.mark.parametrize("layout", ["csr", "csc", "bsr", "bsc"])
def test_compressed_sparse_tensors_are_parked_by_their_parts(layout: str) -> None:
    """A CSR, CSC, BSR or BSC tensor has no storage of its own, as a COO one: every park failed
    ("Cannot access storage of SparseCsrTensorImpl"). Its indices and values are parked."""
    import warnings

    import torch

    from agent.client.torch import TorchParker

    dense = torch.arange(16.0).reshape(4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # sparse compressed support is in beta
        sparse = {
            "csr": dense.to_sparse_csr(),
            "csc": dense.to_sparse_csc(),
            "bsr": dense.to_sparse_bsr((2, 2)),
            "bsc": dense.to_sparse_bsc((2, 2)),
        }[layout]
    indices = "crow_indices" if layout in ("csr", "bsr") else "ccol_indices"
    parts = [getattr(sparse, indices)(), sparse.values()]
    size = sum(p.untyped_storage().nbytes() for p in parts)
    parker = TorchParker([sparse])
    assert parker.park("gpu") >= size > 0
    assert all(p.untyped_storage().nbytes() == 0 for p in parts)
    assert "parked by Baton" in repr(sparse)
    assert parker.restore("gpu") >= size
    assert torch.equal(sparse.to_dense(), dense)


def test_a_tensor_of_another_layout_is_refused_at_the_park_naming_it() -> None:
    import torch

    from agent.client.torch import ParkError, TorchParker

    model = torch.nn.Linear(2, 2)
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    parker = TorchParker(model, [nested])
    with pytest.raises(ParkError, match=r"cannot park a tensor of layout torch\.jagged"):
        parker.park("gpu")
    assert not parker.parked and model.weight.untyped_storage().nbytes() > 0
