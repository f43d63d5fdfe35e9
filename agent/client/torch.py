"""Parks a PyTorch tenant for the agent's `app` backend: device tensors to host buffers and back.

    from agent.client import Baton
    from agent.client.torch import TorchParker

    parker = TorchParker(model, optimizer, reference, sampler.cache)
    baton = Baton(on_park=parker.park, on_restore=parker.restore)
    with baton.turn(), parker.in_use():
        train_step()

On park every storage behind the registered modules (parameters, gradients, buffers),
optimizers (their state) and tensors is copied into one host buffer allocated on the first park
and reused while the storages' sizes stay the same, and the device storage is freed (resized to 0
bytes); restore allocates it again and copies the bytes back. On CUDA the host buffer is pinned,
the copies are non-blocking and spread over several streams, with one synchronisation at the
end, and freed blocks go back to the driver. On the CPU one call copies every storage.
Needs torch (`pip install 'baton-gpu[torch]'`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch

from agent.client.interrupts import deferred_interrupt
from agent.client.parked_tensors import ParkError, guard, tensors_in, unguard
from agent.client.torch_storages import (
    bytes_of,
    make_resizable,
    shared,
    storages_behind,
    storages_of,
)

__all__ = ["MoveStats", "ParkError", "Source", "TorchParker", "tensors_of"]

Source: TypeAlias = (
    torch.nn.Module
    | torch.optim.Optimizer
    | torch.Tensor
    | list[Any]
    | tuple[Any, ...]
    | dict[Any, Any]
    | Callable[[], Iterable[Any]]
)
"""What can be parked: a module, an optimizer, a tensor, a list, tuple or dict of tensors, modules
or optimizers (read again at each park), or a function listing them."""
_CONTAINERS = (torch.Tensor, list, tuple, dict)
"""The sources that are no module or optimizer and not called: their tensors are inside."""


@dataclass
class MoveStats:
    """Totals of the moves this parker made."""

    parks: int = 0
    restores: int = 0
    parked_bytes: int = 0
    restored_bytes: int = 0
    park_s: float = 0.0
    restore_s: float = 0.0
    copied_bytes: int = 0
    """Bytes of storages that could not be resized, copied once when registered."""
    reserved_before_park: int = 0
    """`torch.cuda.memory_reserved` on the device before the last park (CUDA only)."""
    reserved_after_park: int = 0
    """And after it: what the caching allocator kept (its context and workspaces are not in it)."""


def tensors_of(source: Source) -> Iterator[torch.Tensor]:
    """Every tensor a source owns: a module's parameters, their gradients and its buffers."""
    if isinstance(source, torch.nn.Module):
        for param in source.parameters():
            yield param
            if param.grad is not None:
                yield param.grad
        yield from source.buffers()
    elif isinstance(source, torch.optim.Optimizer):
        for state in source.state.values():
            yield from tensors_in(state)
    else:
        yield from _tensors_within(source if isinstance(source, _CONTAINERS) else list(source()))


def _tensors_within(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in a list, tuple or dict (nested), and those of the modules and optimizers
    in it."""
    if isinstance(value, torch.nn.Module | torch.optim.Optimizer):
        yield from tensors_of(value)
    elif isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple | dict):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _tensors_within(item)


class TorchParker:
    """Moves a tenant's device tensors into reused host buffers on park, and back on restore."""

    def __init__(
        self, *sources: Source, device: torch.device | str | None = None, streams: int = 4
    ):
        self.sources: list[Source] = []
        self.device = torch.device(device) if device is not None else None
        self.streams = max(1, streams)
        self.stats = MoveStats()
        self._layout: _Layout | None = None
        """The last park's host buffers, reused while the sizes stay, and its byte views over
        the storages while they are parked."""
        self._parked: list[tuple[torch.UntypedStorage, int]] = []
        self._guarded: list[tuple[torch.Tensor, type]] = []
        """The parked tensors, each with its own class: they have a guarded one meanwhile."""
        self._is_parked = False
        """True between a park and its restore, even one that found nothing to move."""
        self._parked_gpus: set[str] = set()
        """The GPUs parks were asked for and no restore since: one park moves every GPU's."""
        self._lock = threading.Lock()
        self._user: int | None = None
        """The thread inside `in_use()`, holding `_lock`."""
        self.add(*sources)

    def add(self, *sources: Source) -> None:
        """Park these too from the next park on. A storage that cannot be resized (weights
        memory-mapped by `from_pretrained` on the CPU, numpy arrays) is copied once into one
        that can, since a park frees storage by resizing it. `TypeError` for anything that is
        no `Source`."""
        for i, source in enumerate(sources):
            if not (isinstance(source, (torch.optim.Optimizer, *_CONTAINERS)) or callable(source)):
                raise TypeError(
                    f"TorchParker cannot park a {type(source).__name__} (source {i + 1}): pass"
                    " modules, optimizers, tensors, lists or dicts of tensors, or a function"
                    " returning tensors"
                )
        with torch.no_grad():
            self.stats.copied_bytes += make_resizable(
                t for src in sources for t in tensors_of(src) if self._on_device(t)
            )
        self.sources.extend(sources)

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """Hold parks off while the tenant computes: a park asked meanwhile (a revoked turn)
        waits until the work is done. Raises `ParkError` if the tensors are parked now. Nested
        on one thread, the inner block holds nothing more."""
        if self._user == threading.get_ident():
            yield
            return
        with self._lock:
            if self._is_parked:
                raise ParkError("the tensors are parked: the agent restores them before a turn")
            self._user = threading.get_ident()
            try:
                yield
            finally:
                self._user = None

    def _not_in_use_here(self, action: str) -> None:
        """`ParkError` for a park or restore asked on the thread inside `in_use()` (a turn
        taken inside it parks as it yields): waiting for the block to end would wait forever."""
        if self._user == threading.get_ident():
            raise ParkError(
                f"{action} asked inside parker.in_use() on the same thread: take the turn"
                " outside it (with baton.turn(), parker.in_use():)"
            )

    @property
    def parked(self) -> bool:
        """True between a park and its restore."""
        return self._is_parked

    def storages(self) -> list[torch.UntypedStorage]:
        """The distinct non-empty storages on the device behind the sources, in a stable order."""
        return storages_of(self._tensors())

    def _tensors(self) -> list[torch.Tensor]:
        """The distinct tensors on the device behind the sources whose storage is not empty."""
        seen: set[int] = set()
        out = []
        for source in self.sources:
            for tensor in tensors_of(source):
                if id(tensor) in seen or not self._on_device(tensor):
                    continue
                seen.add(id(tensor))
                if any(s.nbytes() for s in storages_behind(tensor)):
                    out.append(tensor)
        return out

    def _on_device(self, tensor: torch.Tensor) -> bool:
        """True when the tensor lives on this parker's device (any device if none was named;
        never the meta device, where a tensor holds no memory)."""
        want, have = self.device, tensor.device
        if have.type == "meta":
            return False
        if want is None:
            return True
        return have.type == want.type and (want.index is None or have.index == want.index)

    def footprint_bytes(self) -> int:
        """Bytes a park would move now."""
        return sum(s.nbytes() for s in self.storages())

    def park(self, gpu: str = "") -> int:
        """Copy every storage to its host buffer, free the device memory; returns bytes moved.
        A tenant of several GPUs is asked once per GPU: the first park moves every storage and
        the others move nothing (0 bytes)."""
        self._not_in_use_here("park")
        with self._lock:
            if gpu in self._parked_gpus:
                raise ParkError(f"already parked{f' on {gpu}' if gpu else ''}: restore first")
            if self._is_parked:
                with deferred_interrupt():  # recorded by the client too, as a park that moves
                    self._parked_gpus.add(gpu)
                return 0
            start = time.perf_counter()
            tensors = self._tensors()
            storages = self._resizable_storages(tensors)
            before = _reserved(storages)
            layout = self._layout_for(storages)
            try:
                self._copy(layout.device, layout.host)
            except BaseException:
                layout.device = []  # the views would keep the storages alive
                raise
            with deferred_interrupt():  # freed storages are parked ones: recorded with them
                for storage in storages:
                    storage.resize_(0)
                self._parked = [(s, n) for s, n in zip(storages, layout.sizes, strict=True)]
                self._guarded = guard(tensors)
                self._is_parked = True
                self._parked_gpus.add(gpu)
            _release_cached(storages)
            if before is not None:
                self.stats.reserved_before_park = before
                self.stats.reserved_after_park = _reserved(storages) or 0
            moved = sum(layout.sizes)
            self.stats.parks += 1
            self.stats.parked_bytes += moved
            self.stats.park_s += time.perf_counter() - start
            return moved

    def restore(self, gpu: str = "") -> int:
        """Allocate every parked storage again and copy its bytes back; returns bytes moved.
        The first restore of a tenant of several GPUs brings every storage back; the restores
        of its other GPUs then move nothing (0 bytes)."""
        self._not_in_use_here("restore")
        with self._lock:
            if gpu not in self._parked_gpus:
                raise ParkError(f"not parked{f' on {gpu}' if gpu else ''}: nothing to restore")
            if not self._is_parked:
                with deferred_interrupt():  # recorded by the client too, as a restore that moves
                    self._parked_gpus.discard(gpu)
                return 0
            start = time.perf_counter()
            for storage, nbytes in self._parked:
                storage.resize_(nbytes)
            assert self._layout is not None
            self._copy(self._layout.host, [bytes_of(s) for s, _ in self._parked])
            self._layout.device = []  # a storage the program drops from now on is freed
            unguard(self._guarded)
            # Cut before here (a Ctrl-C in a restore a grant owes), it runs again whole. From
            # here it is done: a Ctrl-C waits until the client has recorded it (else the GPU
            # stays parked to the client, and each restore it asks again is refused).
            with deferred_interrupt():
                self._is_parked = False
                moved = sum(n for _, n in self._parked)
                self._parked, self._guarded = [], []
                self.stats.restores += 1
                self.stats.restored_bytes += moved
                self.stats.restore_s += time.perf_counter() - start
                self._parked_gpus.discard(gpu)
            return moved

    def _resizable_storages(self, tensors: list[torch.Tensor]) -> list[torch.UntypedStorage]:
        """The storages of `tensors` (`_tensors()`), after copying any that cannot be resized (a
        numpy view since registration pins a storage's size too); `ParkError` before moving
        anything if some still cannot be, since a half-done park frees nothing."""
        storages = storages_of(tensors)
        if in_shm := [s for s in storages if shared(s)]:
            raise ParkError(
                f"{len(in_shm)} storages ({sum(s.nbytes() for s in in_shm)} bytes) are in shared"
                " memory (share_memory_(), a DataLoader worker's tensors), which other processes"
                " map: a park cannot free them; register copies of them, or leave them out"
            )
        if all(s.resizable() for s in storages):
            return storages
        with torch.no_grad():
            self.stats.copied_bytes += make_resizable(tensors)
        storages = storages_of(tensors)
        fixed = [s for s in storages if not s.resizable()]
        if fixed:
            raise ParkError(
                f"{len(fixed)} storages ({sum(s.nbytes() for s in fixed)} bytes) cannot be"
                " resized, so a park cannot free them (memory-mapped weights, numpy"
                " arrays): register them with add(), which copies them once"
            )
        return storages

    def _layout_for(self, storages: list[torch.UntypedStorage]) -> _Layout:
        """Byte views over `storages` and host buffers for them: the last park's buffers if the
        sizes are the same (the usual case), new ones otherwise."""
        sizes = [s.nbytes() for s in storages]
        pin = any(s.device.type == "cuda" for s in storages)
        if self._layout is None or (self._layout.sizes, self._layout.pinned) != (sizes, pin):
            self._layout = None  # let the old buffers go before allocating new ones
            self._layout = _Layout.build(sizes, pin)
        self._layout.device = [bytes_of(s) for s in storages]
        return self._layout

    def _copy(self, sources: list[torch.Tensor], targets: list[torch.Tensor]) -> None:
        """`target.copy_(source)` for each pair: the CPU ones in one call; the CUDA ones on
        several streams, one sync at the end."""
        pairs = list(zip(sources, targets, strict=True))
        cuda = [p for p in pairs if p[0].is_cuda or p[1].is_cuda]
        if len(cuda) < len(pairs):
            cpu = [p for p in pairs if not (p[0].is_cuda or p[1].is_cuda)]
            torch._foreach_copy_([dst for _, dst in cpu], [src for src, _ in cpu])
        if not cuda:
            return
        device = cuda[0][0].device if cuda[0][0].is_cuda else cuda[0][1].device
        # After all the tenant's queued work: a park runs on the agent's callback thread, while
        # the work was queued by the training thread (on its streams, not this thread's).
        torch.cuda.synchronize(device)
        streams = [torch.cuda.Stream(device) for _ in range(min(self.streams, len(cuda)))]
        for i, (src, dst) in enumerate(cuda):
            with torch.cuda.stream(streams[i % len(streams)]):
                dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(device)


@dataclass
class _Layout:
    """One host buffer split into a view for each storage of a park, and, while parked, byte
    views over those storages.

    The host buffer is kept between parks and reused while the sizes stay; the byte views are
    dropped at the restore, since they would keep alive storages the program lets go of (a
    dropped trainer's optimizer state).
    """

    sizes: list[int]
    pinned: bool
    host: list[torch.Tensor]
    device: list[torch.Tensor]

    @classmethod
    def build(cls, sizes: list[int], pin: bool) -> _Layout:
        buffer = torch.empty(sum(sizes), dtype=torch.uint8, device="cpu", pin_memory=pin)
        host = list(buffer.split(sizes)) if sizes else []
        return cls(sizes, pin, host, [])


def _reserved(storages: list[torch.UntypedStorage]) -> int | None:
    """Bytes the caching allocator holds on the storages' CUDA device; None off CUDA."""
    cuda = [s.device for s in storages if s.device.type == "cuda"]
    return int(torch.cuda.memory_reserved(cuda[0])) if cuda else None


def _release_cached(storages: list[torch.UntypedStorage]) -> None:
    """Hand freed CUDA blocks back to the driver, so another process can use the memory."""
    if any(s.device.type == "cuda" for s in storages):
        torch.cuda.empty_cache()
