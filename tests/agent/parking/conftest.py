"""Fixtures for the parking tests: a fake GPU directory with two simulated GPUs."""

from __future__ import annotations

import pytest

from agent.parking.backends.fake import FakeBackend
from baton.contract.names import MIB, fake_gpu_uuid

GPU = fake_gpu_uuid(0)
GPU1 = fake_gpu_uuid(1)
SCALE = 1 / 64
"""One simulated MiB is 16 KiB of real bytes."""


@pytest.fixture
def fake_root(tmp_path):
    return tmp_path / "fakegpu"


@pytest.fixture
def backend(fake_root):
    b = FakeBackend(fake_root, {GPU: 100 * MIB, GPU1: 100 * MIB}, scale=SCALE, lock_timeout=2.0)
    yield b
    b.close()
