"""GPU discovery: NVML on real nodes, declared fake GPUs elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from baton.contract.names import (
    MAX_FAKE_GPUS,
    MIB,
    TooManyFakeGpus,
    fake_gpu_sizes,
    fake_gpu_uuid,
)
from nodegpu.inventory import NodeGpu

FAKE_MODEL = "Baton Fake GPU"


class DiscoveryError(Exception):
    """No GPU could be found or declared; the message says what is missing."""


class BadFakeGpus(DiscoveryError):
    """The `--fake-gpus` value itself cannot be right (a usage mistake, not what the node has)."""


def parse_fake_gpus(spec: str, node_name: str) -> list[NodeGpu]:
    """GPUs from `COUNTxMEMORY_MIB` (e.g. `2x81920`), `MIB,MIB,...`, or a JSON/YAML file.

    The file holds a list of `{memoryMiB, model?, uuid?}` objects, in index order. UUIDs not
    given are `baton.contract.names.fake_gpu_uuid(index, node_name)`, as the agent's fake
    backend names them.
    """
    path = Path(spec)
    if _is_file(path):
        return _gpus_from_file(path, node_name)
    try:
        sizes = fake_gpu_sizes(spec)
    except TooManyFakeGpus as err:
        raise BadFakeGpus(str(err)) from None
    except ValueError:
        raise BadFakeGpus(
            f"--fake-gpus {spec!r} is neither COUNTxMEMORY_MIB (e.g. 2x81920), MIB,MIB,... "
            "nor a readable file"
        ) from None
    return [NodeGpu(fake_gpu_uuid(i, node_name), i, FAKE_MODEL, mib) for i, mib in enumerate(sizes)]


def _is_file(path: Path) -> bool:
    """Whether `path` names a file; a spec no path can be (a long `MIB,MIB,...`) names none."""
    try:
        return path.is_file()
    except OSError:  # ENAMETOOLONG: Python 3.11's is_file raises it
        return False


def _gpus_from_file(path: Path, node_name: str) -> list[NodeGpu]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else err
        raise DiscoveryError(f"--fake-gpus file {path} cannot be read: {why}") from None
    try:
        entries = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:
        raise DiscoveryError(
            f"--fake-gpus file {path} is not valid JSON/YAML: {_one_line(err)}"
        ) from None
    if not isinstance(entries, list) or not entries:
        raise DiscoveryError(f"--fake-gpus file {path} must hold a non-empty list of GPUs")
    if len(entries) > MAX_FAKE_GPUS:
        raise DiscoveryError(
            f"--fake-gpus file {path} lists {len(entries)} GPUs: at most {MAX_FAKE_GPUS} per node"
        )
    gpus: list[NodeGpu] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            entry = {}
        mib = entry.get("memoryMiB")
        if not isinstance(mib, int) or isinstance(mib, bool) or mib <= 0:
            raise DiscoveryError(
                f"--fake-gpus file {path}: entry {index} needs a memoryMiB that is an integer "
                "above 0"
            )
        uuid = str(entry.get("uuid") or fake_gpu_uuid(index, node_name))
        twin = next((g.index for g in gpus if g.uuid == uuid), None)
        if twin is not None:
            raise DiscoveryError(
                f"--fake-gpus file {path}: entries {twin} and {index} have the same uuid {uuid}"
            )
        gpus.append(NodeGpu(uuid, index, str(entry.get("model", FAKE_MODEL)), mib))
    return gpus


def _one_line(err: Exception) -> str:
    """A parse error in one line: YAML's own spans several, quoting the text it points at."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem:
        mark = err.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"{err.problem}{where}"
    return " ".join(str(err).split())


def discover_nvml() -> list[NodeGpu]:
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
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // MIB
            gpus.append(
                NodeGpu(
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


def discover(fake_spec: str | None, node_name: str) -> tuple[list[NodeGpu], bool]:
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
