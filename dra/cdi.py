"""CDI specs: one file per prepared claim, which the runtime applies to the claim's containers.

The spec's claim device (`baton.dev/claim=<claim UID>`) carries what the device plugin's
Allocate gives a container (`nodegpu.container.container_allocation`): `BATON_GPUS`,
`BATON_AGENT_SOCKET`, the agent socket's directory bind-mounted, and, unless a vendor CDI kind
is given (`--vendor-cdi nvidia.com/gpu`, whose IDs the kubelet then passes too),
`NVIDIA_VISIBLE_DEVICES`. Each allocated device has a CDI device of its own too
(`baton.dev/claim=<claim UID>-gpu-1`, setting `BATON_CLAIM_GPU_1=<uuid>`), the first ID of its
result, before the claim's: the kubelet names a device by that ID when it shows its health in
the pod's status, and drops a repeated one, so each GPU of a claim needs its own.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from baton.contract import names
from nodegpu.container import container_allocation

CDI_VERSION = "0.6.0"
_PREFIX = "baton-claim-"


_VENDOR = re.compile(r"^[A-Za-z]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_-]*[A-Za-z0-9])?$")


def kind_problem(kind: str) -> str | None:
    """What makes `kind` no CDI kind (`vendor/class`, e.g. `nvidia.com/gpu`), or None: the
    runtime refuses a device ID of such a kind, so every container of a claim would fail."""
    vendor, slash, klass = kind.partition("/")
    if not slash:
        return f"{kind!r} is not a CDI kind vendor/class (e.g. nvidia.com/gpu)"
    if not _VENDOR.match(vendor):
        return (
            f"{kind!r}: vendor {vendor!r} must start with a letter, end with a letter or digit "
            "and hold only letters, digits, '.', '-' and '_'"
        )
    if not _CLASS.match(klass):
        return (
            f"{kind!r}: class {klass!r} must start with a letter, end with a letter or digit "
            "and hold only letters, digits, '-' and '_'"
        )
    return None


def cdi_id(claim_uid: str, device: str | None = None) -> str:
    """The qualified CDI ID the kubelet passes to the runtime: the claim's device, or (with
    `device`, e.g. `gpu-1`) that allocated device's."""
    return f"{names.CDI_KIND_CLAIM}={claim_uid if device is None else f'{claim_uid}-{device}'}"


def device_env(device: str) -> str:
    """The variable a device's own CDI device sets to its GPU's UUID (`gpu-1`:
    `BATON_CLAIM_GPU_1`)."""
    return names.ENV_CLAIM_PREFIX + device.upper().replace("-", "_")


def spec_path(spec_dir: Path, claim_uid: str) -> Path:
    """Where a claim's spec lives."""
    return spec_dir / f"{_PREFIX}{claim_uid}.json"


def claim_spec(
    claim_uid: str, devices: Mapping[str, str], vendor_kind: str | None
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The spec for a claim's allocated devices (device name -> GPU UUID), and the vendor's
    CDI IDs to return beside ours."""
    given = container_allocation(sorted(set(devices.values())), vendor_kind)
    edits = {
        "env": [f"{k}={v}" for k, v in sorted(given.envs.items())],
        "mounts": [
            {
                "hostPath": host,
                "containerPath": container,
                "options": ["rbind", "ro" if read_only else "rw"],
            }
            for host, container, read_only in given.mounts
        ],
    }
    spec = {
        "cdiVersion": CDI_VERSION,
        "kind": names.CDI_KIND_CLAIM,
        "devices": [{"name": claim_uid, "containerEdits": edits}]
        + [
            {
                "name": f"{claim_uid}-{device}",
                "containerEdits": {"env": [f"{device_env(device)}={gpu}"]},
            }
            for device, gpu in sorted(devices.items())
        ],
    }
    return spec, given.cdi_devices


def write_spec(spec_dir: Path, claim_uid: str, spec: dict[str, Any]) -> Path:
    """Write the spec atomically (the runtime never reads half a file)."""
    spec_dir.mkdir(parents=True, exist_ok=True)
    path = spec_path(spec_dir, claim_uid)
    tmp = path.with_suffix(".tmp")
    try:
        with open(tmp, "w") as out:
            json.dump(spec, out, indent=1)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return path


def remove_spec(spec_dir: Path, claim_uid: str) -> None:
    """Remove a claim's spec (gone already is fine)."""
    spec_path(spec_dir, claim_uid).unlink(missing_ok=True)


def orphan_specs(spec_dir: Path, kept: Iterable[str]) -> list[Path]:
    """Our spec files whose claim is not in `kept` (written by a prepare that never answered),
    and every half-written temporary one (a driver killed while writing it)."""
    keep = set(kept)
    if not spec_dir.is_dir():
        return []
    return [
        p
        for p in spec_dir.glob(f"{_PREFIX}*")
        if p.suffix == ".tmp" or (p.suffix == ".json" and p.name[len(_PREFIX) : -5] not in keep)
    ]
