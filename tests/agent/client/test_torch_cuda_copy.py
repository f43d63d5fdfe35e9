"""TorchParker's CUDA branch without a GPU: its copies wait for all of the tenant's queued work,
the training thread's included, not only the calling thread's stream (a park runs on the
agent's callback thread while the work was queued by the training thread)."""

from __future__ import annotations

import contextlib
import importlib.util
import threading
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")


class FakeCudaTensor:
    """Enough of a CUDA tensor for `TorchParker._copy`: it records its copies."""

    is_cuda = True

    def __init__(self, name: str, events: list[str]) -> None:
        self.name = name
        self.events = events
        self.device = "cuda:0"

    def copy_(self, src: Any, non_blocking: bool = False) -> None:
        self.events.append(f"copy {src.name}->{self.name} on {threading.current_thread().name}")


class FakeHostTensor(FakeCudaTensor):
    is_cuda = False


class FakeStream:
    def __init__(self, events: list[str], name: str) -> None:
        self.events, self.name = events, name

    def wait_stream(self, other: FakeStream) -> None:
        self.events.append(f"{self.name} waits for {other.name}")


def test_park_copies_start_after_the_whole_device_is_synchronised(monkeypatch):
    import torch

    from agent.client.torch import TorchParker

    events: list[str] = []
    streams = iter(range(100))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("sync all"))
    monkeypatch.setattr(
        torch.cuda, "Stream", lambda device=None: FakeStream(events, f"copy{next(streams)}")
    )
    monkeypatch.setattr(
        torch.cuda,
        "current_stream",
        lambda device=None: FakeStream(events, f"{threading.current_thread().name}'s stream"),
    )
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    parker = TorchParker(streams=2)
    pairs = [(FakeCudaTensor(f"w{i}", events), FakeHostTensor(f"h{i}", events)) for i in range(3)]
    sources, targets = [src for src, _ in pairs], [dst for _, dst in pairs]
    agent_thread = threading.Thread(target=parker._copy, args=(sources, targets), name="callback")
    agent_thread.start()
    agent_thread.join(10)
    copies = [i for i, e in enumerate(events) if e.startswith("copy w")]
    assert len(copies) == 3
    assert "sync all" in events[: copies[0]], events
    assert events[-1] == "sync all"
