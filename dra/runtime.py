"""Whether the node's container runtime applies CDI devices (else a claim's env never arrives).

The kubelet passes CDI IDs in the CRI request; a runtime without CDI (containerd before 1.7) or
with it off (1.7's default) starts the container without them, silently. The driver refuses
to prepare a claim there rather than let a tenant start without its GPU and socket.
"""

from __future__ import annotations

import re

AUTO, ON, OFF = "auto", "on", "off"
_VERSION = re.compile(r"^(\w[\w.-]*)://v?(\d+)\.(\d+)")


def cdi_refusal(runtime_version: str, declared: str = AUTO) -> str | None:
    """Why claims cannot be prepared on a node with this runtime, or None when they can.

    `runtime_version` is the node's `status.nodeInfo.containerRuntimeVersion`
    (`containerd://2.3.4`); `declared` (`--runtime-cdi`) overrides what it implies.
    """
    if declared == ON:
        return None
    if declared == OFF:
        return "the node's runtime was declared without CDI (--runtime-cdi=off)"
    match = _VERSION.match(runtime_version.strip())
    if not match:
        return (
            f"the node's container runtime {runtime_version!r} is unknown: cannot tell whether "
            "it applies CDI devices; pass --runtime-cdi=on if it does"
        )
    name, major, minor = match.group(1), int(match.group(2)), int(match.group(3))
    if name == "containerd":
        if (major, minor) >= (2, 0):
            return None
        if (major, minor) == (1, 7):
            return (
                f"containerd {major}.{minor} applies CDI devices only with enable_cdi = true in "
                "its CRI config; turn it on and pass --runtime-cdi=on"
            )
        return (
            f"containerd {major}.{minor} cannot apply CDI devices (1.7 with enable_cdi, or 2.0+, "
            "is needed): a tenant would start without BATON_GPUS and the agent socket; use the "
            "device-plugin install on this node or upgrade containerd"
        )
    if name == "cri-o" and (major, minor) >= (1, 23):
        return None
    return (
        f"the node's container runtime {runtime_version!r} is not known to apply CDI devices; "
        "pass --runtime-cdi=on if it does"
    )
