"""Every version hack/gpu-check.sh depends on, as one JSON line; exit 1 at once, saying why, on a
missing package or call, or a version the cuda backend refuses.

    python3 hack/gpu-check/versions.py            # on the GPU machine
    python3 hack/gpu-check/versions.py --stand-in # the dry run: no torch, stand-in driver
"""

from __future__ import annotations

import json
import platform
import sys
from importlib import import_module, metadata

PACKAGES = (
    "grpcio", "protobuf", "kubernetes", "orjson", "cuda-bindings", "cuda-pathfinder",
    "nvidia-ml-py", "prometheus-client", "httpx", "typer", "rich", "uvloop", "pyyaml",
    "psutil", "urllib3", "requests-oauthlib", "websocket-client", "durationpy",
)  # fmt: skip
MODULES = ("grpc", "google.protobuf", "kubernetes", "orjson", "pynvml", "cuda.bindings.driver")
STUBS = ("baton._pb.agent_pb2_grpc", "agent.assembly", "agent.client", "tests.harness.fakeapi")


def found(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def fail(why: str, seen: dict[str, object]) -> int:
    print(json.dumps(seen))
    print(f"gpu-check: {why}", file=sys.stderr)
    return 1


def main() -> int:
    stand_in = "--stand-in" in sys.argv[1:]
    seen: dict[str, object] = {"python": platform.python_version()}
    wanted = PACKAGES if stand_in else (*PACKAGES, "torch")
    seen.update({name: found(name) for name in wanted})
    missing = [name for name in wanted if seen[name] is None]
    if missing:
        return fail(f"missing packages: {', '.join(missing)}", seen)
    for module in (*MODULES, *STUBS):
        try:
            where = import_module(module).__file__ or ""
        except Exception as e:  # the stubs refuse an old grpcio or protobuf here
            return fail(f"import {module} failed: {type(e).__name__}: {e}", seen)
        seen[f"{module} from"] = where
    from agent.parking.backends.base import BackendUnavailable
    from agent.parking.backends.cuda_driver import check_bindings, check_driver_release

    driver = import_module("cuda.bindings.driver")
    nvml = import_module("pynvml")
    try:
        check_bindings(driver, str(seen["cuda-bindings"]))
        nvml.nvmlInit()
        seen["nvidia driver"] = check_driver_release(nvml)
    except BackendUnavailable as e:
        return fail(str(e), seen)
    _err, api = driver.cuDriverGetVersion()
    seen["cuda driver api"] = int(api)
    if not stand_in:
        torch = import_module("torch")
        seen["torch cuda"] = torch.version.cuda
        if not torch.cuda.is_available():
            return fail("torch sees no CUDA GPU", seen)
        seen["gpu"] = torch.cuda.get_device_name(0)
    print(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
