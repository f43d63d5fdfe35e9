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
    """Point every tensor whose storage cannot be resized at a resizable copy of it (in place,
    so modules and optimizers keep them); returns the bytes copied. Storages over overlapping
    memory (one storage, or numpy slices of one array each given to `from_numpy`) share one
    copy of the memory they span, so their tensors still see each other's writes."""
    fixed = [
        (tensor, storage)
        for tensor in tensors
        if tensor.layout == torch.strided  # a park refuses its storages if they stay fixed
        and not (storage := tensor.untyped_storage()).resizable()
        and storage.nbytes()
    ]
    copies: dict[Span, tuple[torch.UntypedStorage, int]] = {}  # its region's copy, offset
    region: list[tuple[Span, torch.UntypedStorage]] = []  # overlapping storages, by address
    region_end: tuple[str, int] = ("", 0)
    copied = 0
    for span, storage in sorted({_span(s): s for _, s in fixed}.items(), key=lambda i: i[0]):
        device, start, end = span
        if not (device == region_end[0] and start < region_end[1]):  # no overlap: a new one
            copied += _copy_region(region, copies)
            region = []
        region.append((span, storage))
        region_end = device, max(end, region_end[1] if region[1:] else 0)
    copied += _copy_region(region, copies)
    for tensor, storage in fixed:
        copy, offset = copies[_span(storage)]
        if offset % tensor.element_size():  # not at a whole element of the copy: its own
            copy, offset = storage.clone(), 0
            copied += storage.nbytes()
        first = offset // tensor.element_size() + tensor.storage_offset()
        tensor.set_(copy, first, tensor.size(), tensor.stride())
    return copied


Span = tuple[str, int, int]
"""A storage's device, and the addresses of its first byte and the byte past its last."""


def _span(storage: torch.UntypedStorage) -> Span:
    return str(storage.device), storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def _copy_region(
    region: list[tuple[Span, torch.UntypedStorage]],
    copies: dict[Span, tuple[torch.UntypedStorage, int]],
) -> int:
    """Copy the memory the overlapping storages of `region` span into one new storage, noting
    each's offset in it; returns its size."""
    if not region:
        return 0
    start, end = region[0][0][1], max(span[2] for span, _ in region)
    copy = torch.UntypedStorage(end - start, device=region[0][1].device)
    for span, storage in region:
        bytes_of(copy)[span[1] - start : span[2] - start].copy_(bytes_of(storage))
        copies[span] = copy, span[1] - start
    return end - start


def bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over the whole storage, to copy it byte for byte."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
