"""GPU discovery: NVML on real nodes, declared fake GPUs elsewhere."""

from __future__ import annotations

import json
import re
import uuid as uuidlib
from pathlib import Path

import yaml

from deviceplugin.devices import Gpu

_FAKE_SPEC = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")
_FAKE_NAMESPACE = uuidlib.UUID("6f1f0a52-4b57-4a9b-9a3c-2d1b2c0e0b47")
FAKE_MODEL = "Baton Fake GPU"


class DiscoveryError(Exception):
    """No GPU could be found or declared; the message says what is missing."""


def fake_uuid(node_name: str, index: int) -> str:
    """A stable UUID for fake GPU `index` on `node_name`, shaped like NVML's `GPU-...`."""
    return f"GPU-{uuidlib.uuid5(_FAKE_NAMESPACE, f'{node_name}/{index}')}"


def parse_fake_gpus(spec: str, node_name: str) -> list[Gpu]:
    """GPUs from `COUNTxMEMORY_MIB` (e.g. `2x81920`) or from a JSON/YAML file.

    The file holds a list of `{memoryMiB, model?, uuid?}` objects, in index order.
    """
    match = _FAKE_SPEC.match(spec)
    if match:
        count, memory = int(match.group(1)), int(match.group(2))
        if count < 1 or memory < 1:
            raise DiscoveryError(f"--fake-gpus {spec!r}: need at least one GPU of at least 1 MiB")
        return [Gpu(fake_uuid(node_name, i), i, FAKE_MODEL, memory) for i in range(count)]
    path = Path(spec)
    if not path.is_file():
        raise DiscoveryError(
            f"--fake-gpus {spec!r} is neither COUNTxMEMORY_MIB (e.g. 2x81920) nor a readable file"
        )
    return _gpus_from_file(path, node_name)


def _gpus_from_file(path: Path, node_name: str) -> list[Gpu]:
    text = path.read_text()
    try:
        entries = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:
        raise DiscoveryError(f"fake GPU file {path} is not valid JSON/YAML: {err}") from err
    if not isinstance(entries, list) or not entries:
        raise DiscoveryError(f"fake GPU file {path} must hold a non-empty list of GPUs")
    gpus = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("memoryMiB"), int):
            raise DiscoveryError(f"fake GPU file {path}: entry {index} needs an integer memoryMiB")
        uuid = str(entry.get("uuid") or fake_uuid(node_name, index))
        gpus.append(Gpu(uuid, index, str(entry.get("model", FAKE_MODEL)), entry["memoryMiB"]))
    return gpus


def discover_nvml() -> list[Gpu]:
    """The node's NVIDIA GPUs via NVML; DiscoveryError says why there are none."""
    try:
        import pynvml
    except ImportError as err:
        raise DiscoveryError("NVML bindings missing (pip install nvidia-ml-py)") from err
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        raise DiscoveryError(f"NVML unavailable ({err}): no NVIDIA driver on this node") from err
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            gpus.append(
                Gpu(
                    _text(pynvml.nvmlDeviceGetUUID(handle)),
                    index,
                    _text(pynvml.nvmlDeviceGetName(handle)),
                    int(memory),
                )
            )
    finally:
        pynvml.nvmlShutdown()
    if not gpus:
        raise DiscoveryError("NVML reports no NVIDIA GPU on this node")
    return gpus


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def discover(fake_spec: str | None, node_name: str) -> tuple[list[Gpu], bool]:
    """The GPUs to advertise and whether they are fake; DiscoveryError names what is missing."""
    if fake_spec:
        return parse_fake_gpus(fake_spec, node_name), True
    try:
        return discover_nvml(), False
    except DiscoveryError as err:
        raise DiscoveryError(
            f"no NVIDIA GPU found ({err}) and no --fake-gpus given (BATON_FAKE_GPUS): "
            "run on a GPU node, or declare simulated GPUs, e.g. --fake-gpus 2x81920"
        ) from err
