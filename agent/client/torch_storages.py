"""The storages behind a `TorchParker`'s tensors, and what a park can do with them: which
storages hold a tensor's bytes (a sparse gradient has two), which a park cannot free (shared
memory, storages that cannot be resized) and the copy that makes them resizable."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from agent.client.parked_tensors import ParkError


def storages_of(tensors: Iterable[torch.Tensor]) -> list[torch.UntypedStorage]:
    """The distinct storages behind `tensors`, in their order."""
    seen: set[int] = set()
    out = []
    for tensor in tensors:
        for storage in storages_behind(tensor):
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                out.append(storage)
    return out


_COMPRESSED = {
    torch.sparse_csr: ("crow_indices", "col_indices", "values"),
    torch.sparse_bsr: ("crow_indices", "col_indices", "values"),
    torch.sparse_csc: ("ccol_indices", "row_indices", "values"),
    torch.sparse_bsc: ("ccol_indices", "row_indices", "values"),
}
"""The parts of each compressed sparse layout, each a strided tensor over a storage."""


def storages_behind(tensor: torch.Tensor) -> list[torch.UntypedStorage]:
    """The storages holding a tensor's bytes: its own, or a sparse tensor's parts, as it has
    none (a COO tensor's indices and values, as `nn.Embedding(sparse=True)` makes its
    gradient; a CSR, CSC, BSR or BSC one's compressed and plain indices and values).
    `ParkError` naming the layout for any other (mkldnn, jagged): its bytes are not reachable."""
    layout = tensor.layout
    if layout == torch.strided:
        return [tensor.untyped_storage()]
    if layout == torch.sparse_coo:
        return [tensor._indices().untyped_storage(), tensor._values().untyped_storage()]
    if layout in _COMPRESSED:
        return [getattr(tensor, part)().untyped_storage() for part in _COMPRESSED[layout]]
    raise ParkError(
        f"cannot park a tensor of layout {layout} (size={tuple(tensor.shape)}): its bytes are"
        " not in storages a park can free; convert it to a strided or sparse one, or leave it"
        " out"
    )


def shared(storage: torch.UntypedStorage) -> bool:
    """Whether `storage` is host memory other processes map (torch resizes it to 0 but crashes
    the process resizing it back). CUDA storages answer `is_shared()` True always: not these."""
    return storage.device.type == "cpu" and storage.nbytes() > 0 and storage.is_shared()


def make_resizable(tensors: Iterable[torch.Tensor]) -> int:
    """Point every tensor whose storage cannot be resized at a resizable copy of it (one copy
    per storage, shared by its tensors, in place so modules and optimizers keep them); returns
    the bytes copied."""
    copies: dict[int, torch.UntypedStorage] = {}
    copied = 0
    for tensor in tensors:
        if tensor.layout != torch.strided:  # a park refuses its storages if they stay fixed
            continue
        storage = tensor.untyped_storage()
        if storage.resizable() or storage.nbytes() == 0:
            continue
        key = storage.data_ptr()
        if key not in copies:
            copies[key] = storage.clone()
            copied += storage.nbytes()
        tensor.set_(copies[key], tensor.storage_offset(), tensor.size(), tensor.stride())
    return copied


def bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over the whole storage, to copy it byte for byte."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
