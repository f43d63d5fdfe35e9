"""`baton bench evacuate`: park and restore throughput against a plain memory copy of the same size.

`fake`: a simulated GPU in a fresh directory (under /dev/shm when present), bandwidth model off.
`cuda`: a child process allocates device memory through the driver API; the agent's cuda backend
checkpoints and restores it.
"""

from __future__ import annotations

import mmap
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.parking.backends.base import Backend, TenantRef
from baton.contract.meminfo import MEMINFO, mem_available_kib
from baton.contract.names import MIB, fake_gpu_uuid

FILL = bytes(range(256)) * (4 * MIB // 256)


def gbps(nbytes: int, seconds: float) -> float:
    """Gigabytes (10^9) per second, rounded for a report."""
    return round(nbytes / seconds / 1e9, 2) if seconds > 0 else 0.0


def memcpy_seconds(nbytes: int, fresh: bool = True) -> float:
    """Time of one plain copy of `nbytes`: into newly mapped memory (as a park's destination
    is), or into memory already touched."""
    src = memoryview(FILL * -(-nbytes // len(FILL)))[:nbytes]  # one copy of the bytes in memory
    dst = mmap.mmap(-1, nbytes)
    if not fresh:
        memoryview(dst)[:] = src
    start = time.perf_counter()
    memoryview(dst)[:] = src
    seconds = time.perf_counter() - start
    dst.close()
    return seconds


def best_moves(backend: Backend, tenant_id: str, gpu: str, runs: int) -> tuple[int, float, float]:
    """Park and restore `runs` times; the bytes and the fastest park and restore seconds."""
    outs, ins, nbytes = [], [], 0
    for _ in range(runs):
        start = time.perf_counter()
        nbytes = backend.park(tenant_id, gpu).bytes
        outs.append(time.perf_counter() - start)
        start = time.perf_counter()
        backend.restore(tenant_id, gpu)
        ins.append(time.perf_counter() - start)
    return nbytes, min(outs), min(ins)


def report(backend: str, nbytes: int, out_s: float, in_s: float, runs: int) -> dict[str, Any]:
    """The bench's JSON fields, with the plain copies measured now."""
    fresh = min(memcpy_seconds(nbytes) for _ in range(runs))
    touched = min(memcpy_seconds(nbytes, fresh=False) for _ in range(runs))
    return {
        "backend": backend,
        "bytes": nbytes,
        "out_gbps": gbps(nbytes, out_s),
        "in_gbps": gbps(nbytes, in_s),
        "memcpy_gbps": gbps(nbytes, fresh),
        "memcpy_touched_gbps": gbps(nbytes, touched),
        "out_s": round(out_s, 4),
        "in_s": round(in_s, 4),
        "runs": runs,
    }


def bench_fake(size_mib: int, runs: int = 3) -> dict[str, Any]:
    """Park/restore `size_mib` MiB of real bytes on a fake GPU (scale 1, no bandwidth model)."""
    from agent.parking.backends.fake import FakeBackend
    from agent.parking.fakegpu import FakeGpuMemory

    root = tempfile.mkdtemp(prefix="baton-evacuate-", dir=fake_dir())
    gpu = fake_gpu_uuid(0)
    try:
        backend = FakeBackend(root, {gpu: size_mib * MIB}, scale=1.0)
        mem = FakeGpuMemory("bench", root)
        mem.allocate(gpu, size_mib)
        with mem.access(gpu) as path, path.open("r+b") as f:
            for _ in range(size_mib * MIB // len(FILL)):
                f.write(FILL)
        nbytes, out_s, in_s = best_moves(backend, "bench", gpu, runs)
        backend.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report("fake", nbytes, out_s, in_s, runs)


CUDA_CHILD = """
import sys
from cuda.bindings import driver as d
def ok(r):
    if r[0] != d.CUresult.CUDA_SUCCESS:
        sys.exit(f"CUDA error {r[0]}")
    return r[1:]
size = int(sys.argv[1])
ok(d.cuInit(0))
(dev,) = ok(d.cuDeviceGet(0))
(ctx,) = ok(d.cuDevicePrimaryCtxRetain(dev))
ok(d.cuCtxSetCurrent(ctx))
(ptr,) = ok(d.cuMemAlloc(size))
ok(d.cuMemsetD8(ptr, 0xA5, size))
ok(d.cuCtxSynchronize())
print("ready", flush=True)
sys.stdin.readline()
"""


def bench_cuda(size_mib: int, runs: int = 3) -> dict[str, Any]:
    """Checkpoint/restore a child process holding `size_mib` MiB of device memory."""
    from agent.parking.backends.cuda import CudaBackend

    backend = CudaBackend()
    gpu = next(iter(backend.gpu_memory()))
    child = subprocess.Popen(
        [sys.executable, "-c", CUDA_CHILD, str(size_mib * MIB)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("the CUDA child process could not allocate its memory")
        backend.attach(TenantRef("bench", (gpu,), pids=(child.pid,)))
        nbytes, out_s, in_s = best_moves(backend, "bench", gpu, runs)
        child.stdin.write("done\n")
        child.stdin.flush()
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
        backend.close()
    return report("cuda", nbytes, out_s, in_s, runs)


BENCHES: dict[str, Callable[[int, int], dict[str, Any]]] = {
    "fake": bench_fake,
    "cuda": bench_cuda,
}


def fake_dir() -> str:
    """Where the fake GPU's regions and their parked copies go: /dev/shm when present."""
    return "/dev/shm" if Path("/dev/shm").is_dir() else tempfile.gettempdir()


def check_room(backend: str, size_mib: int) -> None:
    """`ValueError` naming --size-mib where the bench's bytes would not fit. A fake park holds
    the region twice in `fake_dir()` (the device file and its host copy) and the plain copies
    hold it twice in memory; past either the machine runs out (tmpfs pages are memory too) and
    the kernel kills the bench mid-copy, its files left behind."""
    need = 2 * size_mib * MIB
    if backend == "fake":
        where = fake_dir()
        free = shutil.disk_usage(where).free
        if need > free:
            raise ValueError(
                f"--size-mib {size_mib}: a park holds the region twice ({need // MIB} MiB) and "
                f"{where} has {free // MIB} MiB free"
            )
    available = mem_available_kib(Path(MEMINFO).read_text()) * 1024
    if need > available:
        raise ValueError(
            f"--size-mib {size_mib}: the plain copies hold the region twice ({need // MIB} MiB) "
            f"and the machine has {available // MIB} MiB of memory available"
        )


def run(backend: str, size_mib: int, runs: int) -> dict[str, Any]:
    """Run the bench for `backend`, once its flags are checked and its bytes found room."""
    if backend not in BENCHES:
        raise ValueError(f"evacuate bench backends: {', '.join(BENCHES)} (not {backend!r})")
    if size_mib < 1:
        raise ValueError(f"--size-mib {size_mib}: give 1 MiB or more")
    if runs < 1:
        raise ValueError(f"--runs {runs}: give 1 run or more")
    check_room(backend, size_mib)
    return BENCHES[backend](size_mib, runs)
