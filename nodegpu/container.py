"""What a container given GPUs gets: env, the agent socket mount, CDI device names.

The device plugin answers Allocate with it; the DRA driver writes it into a claim's CDI spec.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from baton.contract import names


@dataclass(frozen=True)
class ContainerAllocation:
    """What a container gets from Allocate: env, mounts and CDI device names."""

    envs: dict[str, str]
    mounts: tuple[tuple[str, str, bool], ...]
    cdi_devices: tuple[str, ...]


def container_allocation(gpus: Sequence[str], cdi_kind: str | None = None) -> ContainerAllocation:
    """The env, agent-socket mount and (with a CDI kind) CDI names for a container's GPUs."""
    envs = {
        names.ENV_GPUS: ",".join(gpus),
        names.ENV_AGENT_SOCKET: names.AGENT_SOCKET,
    }
    cdi: tuple[str, ...] = ()
    if cdi_kind:
        cdi = tuple(f"{cdi_kind}={uuid}" for uuid in gpus)
    else:
        envs[names.ENV_NVIDIA_VISIBLE_DEVICES] = ",".join(gpus)
    mounts = ((names.AGENT_SOCKET_DIR, names.AGENT_SOCKET_DIR, True),)
    return ContainerAllocation(envs=envs, mounts=mounts, cdi_devices=cdi)
