"""The tensors a `TorchParker` parked, guarded until their restore.

A park frees a tensor's device storage and leaves its shape, so torch would read freed memory
through it: printing it, `.item()`, `.cpu()`, saving it or a step over it crash the process or
see garbage (a checkpoint is written empty). While parked, each tensor the parker reached takes a
subclass of its class whose `__torch_function__` lets metadata through (shape, dtype, device,
`numel()`, `.grad`), prints the tensor as parked and refuses everything else with `ParkError`.
The restore gives each its class back. A view of a parked tensor taken before the park is a
tensor the parker never saw: it is not guarded.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass
from torch.overrides import resolve_name


class ParkError(RuntimeError):
    """Parking or restoring could not run as asked (parked twice, restored without a park), or
    a parked tensor's values were touched between turns."""


_GETTERS = (
    *("shape", "dtype", "device", "layout", "ndim", "requires_grad", "is_leaf", "grad"),
    *("grad_fn", "is_cuda", "is_cpu", "is_meta", "is_sparse", "is_quantized", "itemsize"),
    *("nbytes", "_version", "output_nr"),
)
_SETTERS = ("grad", "requires_grad")
_METHODS = (
    *("size", "dim", "ndimension", "numel", "nelement", "stride", "storage_offset"),
    *("element_size", "is_contiguous", "is_floating_point", "is_complex", "is_signed"),
    *("get_device", "untyped_storage", "data_ptr", "is_pinned", "requires_grad_"),
    *("__len__", "__hash__", "__dir__"),
)
_READS_NO_VALUES: frozenset[Any] = frozenset(
    [getattr(torch.Tensor, name).__get__ for name in _GETTERS]
    + [getattr(torch.Tensor, name).__set__ for name in _SETTERS]
    + [getattr(torch.Tensor, name) for name in _METHODS]
    + [torch.is_complex, torch.is_floating_point, torch.numel]
)
"""What a parked tensor answers as usual: its metadata (`optimizer.zero_grad()` sets `.grad`)."""


class _Parked:
    """Mixed in before a parked tensor's own class (see the module docstring)."""

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _READS_NO_VALUES:
            with DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        parked = [t for t in tensors_in([args, kwargs]) if isinstance(t, _Parked)]
        about = _metadata(parked[0]) if parked else "size unknown"
        if func is torch.Tensor.__repr__ or (func is torch.Tensor.__format__ and not args[1]):
            return f"tensor(<parked by Baton until the next turn>, {about})"
        name = resolve_name(func) or getattr(func, "__name__", repr(func))
        raise ParkError(
            f"{name}: the tensor ({about}) is parked: Baton moved its bytes to host memory between"
            " turns and restores them when this process next acquires a turn; use it inside a"
            " turn"
        )


def guard(tensors: Iterable[torch.Tensor]) -> list[tuple[torch.Tensor, type]]:
    """Give each tensor its parked class; returns each guarded tensor with its own class. A
    tensor of a class Python cannot swap (another layout) stays as it is."""
    guarded = []
    for tensor in tensors:
        own = type(tensor)
        if issubclass(own, _Parked):
            continue
        try:
            tensor.__class__ = _parked_class(own)
        except TypeError:
            continue
        guarded.append((tensor, own))
    return guarded


def unguard(guarded: list[tuple[torch.Tensor, type]]) -> None:
    """Give each tensor its own class back."""
    for tensor, own in guarded:
        tensor.__class__ = own


_CLASSES: dict[type, type] = {}


def _parked_class(own: type) -> type:
    """The parked subclass of `own` (made once): `isinstance` answers as before."""
    parked = _CLASSES.get(own)
    if parked is None:
        parked = _CLASSES.setdefault(own, type(f"Parked{own.__name__}", (_Parked, own), {}))
    return parked


def _metadata(tensor: torch.Tensor) -> str:
    """What a parked tensor still knows about itself, as torch's repr names it."""
    with DisableTorchFunctionSubclass():
        grad = ", requires_grad=True" if tensor.requires_grad else ""
        size = tuple(tensor.shape)
        return f"size={size}, dtype={tensor.dtype}, device='{tensor.device}'{grad}"


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Tensors inside `value` (nested lists, tuples and dicts, as optimizer state and a call's
    arguments hold them)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from tensors_in(item)
