"""A tensor TorchParker parked, touched between turns as a training loop or TRL's logging may:
it prints as parked and keeps its metadata; what reads or writes its values raises `ParkError`
naming the call and the parked state (torch read freed memory: the tenant died of SIGSEGV on
the CPU, or a checkpoint was saved empty), and after the restore all of it works again."""

from __future__ import annotations

import importlib.util
import io
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")


def trained() -> tuple[Any, Any]:
    """A Linear after one Adam step: weights, gradients and optimizer state to park."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_a_parked_tensor_prints_as_parked_and_keeps_its_metadata() -> None:
    import torch

    from agent.client.torch import TorchParker

    model, optimizer = trained()
    grad = model.weight.grad
    parker = TorchParker(model, optimizer)
    parker.park("gpu")
    text = repr(model.weight)
    assert text.startswith("Parameter containing:\ntensor(<parked by Baton until the next turn>")
    assert "size=(2, 3), dtype=torch.float32, device='cpu', requires_grad=True)" in text
    assert str(model.bias) == repr(model.bias) and f"{grad}" == repr(grad)
    assert "tensor(<parked by Baton" in repr(optimizer.state[model.weight]["exp_avg"])
    assert model.weight.shape == (2, 3) and model.weight.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) == 8  # a parameter count, as logs show
    assert model.weight.grad is grad and model.weight.requires_grad
    assert isinstance(model.weight, torch.nn.Parameter)
    assert repr(model) == "Linear(in_features=3, out_features=2, bias=True)"
    optimizer.zero_grad()  # sets each .grad to None
    assert model.weight.grad is None
    parker.restore("gpu")
    assert type(model.weight) is torch.nn.Parameter and type(grad) is torch.Tensor
    assert repr(model.weight).startswith("Parameter containing:\ntensor([[")


def save_state(model: Any, optimizer: Any) -> None:
    import torch

    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, io.BytesIO())


def step(model: Any, optimizer: Any) -> None:
    model(__import__("torch").ones(1, 3)).sum().backward()
    optimizer.step()


def steps(model: Any, optimizer: Any) -> Any:
    """The optimizer's step count: a 0-dim tensor, parked with its state."""
    return optimizer.state[model.weight]["step"]


TOUCHES: dict[str, tuple[str, Callable[[Any, Any], Any]]] = {
    "item": ("torch.Tensor.item", lambda *both: steps(*both).item()),
    "cpu": ("torch.Tensor.cpu", lambda model, _: model.weight.cpu()),
    "a formatted number": ("torch.Tensor.__format__", lambda *both: f"{steps(*both):.0f}"),
    "a checkpoint": ("torch.Tensor.detach", save_state),
    "the optimizer's state alone": (
        "torch.Tensor.__reduce_ex__",
        lambda _, optimizer: __import__("torch").save(optimizer.state_dict(), io.BytesIO()),
    ),
    "a step": ("torch.nn.functional.linear", step),
    "an optimizer step": ("torch.Tensor.add_", lambda _, optimizer: optimizer.step()),
    "a copy": ("torch.Tensor.data.__get__", lambda model, _: __import__("copy").deepcopy(model)),
}


@pytest.mark.parametrize("touch", TOUCHES)
def test_touching_a_parked_tensors_values_raises_park_error_naming_it(touch: str) -> None:
    import torch

    from agent.client.torch import ParkError, TorchParker

    model, optimizer = trained()
    before = [p.detach().clone() for p in model.parameters()]
    parker = TorchParker(model, optimizer)
    parker.park("gpu")
    call, do = TOUCHES[touch]
    with pytest.raises(ParkError) as raised:
        do(model, optimizer)
    message = str(raised.value)
    assert message.startswith(call), message
    assert "is parked: Baton moved its bytes to host memory" in message
    assert message.endswith("when this process next acquires a turn; use it inside a turn")
    assert "\n" not in message
    parker.restore("gpu")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    do(model, optimizer)  # inside the turn it works
