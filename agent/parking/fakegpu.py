"""What a tenant on a simulated GPU uses for its device memory (`FakeGpuMemory`); the files'
layout, shared with the fake backend, lives in `agent.parking.backends.fakegpu`."""

from agent.parking.backends.fakegpu import FakeGpuMemory, NotResident, PatternMismatch, fake_root

__all__ = ["FakeGpuMemory", "NotResident", "PatternMismatch", "fake_root"]
