"""The one source of truth for Baton's resource names, annotation keys, env vars, paths and ports.

Every component imports these values; none spells them out again.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

# Extended resources.
RESOURCE_GPU = "baton.dev/gpu"
"""Time-sliced GPU slots advertised by the device plugin."""
RESOURCE_GPU_MEMORY = "baton.dev/gpu-memory"
"""Device memory a tenant needs during its turn, MiB (extender-managed)."""
RESOURCE_GPU_DUTY = "baton.dev/gpu-duty"
"""Share of GPU time a tenant expects to use, percent 1-100 (extender-managed)."""

# Node annotations (written by the device plugin, read by the extender).
ANNOTATION_GPUS = "baton.dev/gpus"
"""JSON list of {uuid, index, model, memoryMiB, slots, healthy}."""
ANNOTATION_HOST_MEMORY_BUDGET = "baton.dev/host-memory-budget"
"""Host DRAM budget for parked GPU memory on the node, MiB."""

# Pod annotations.
ANNOTATION_ASSIGNED_GPUS = "baton.dev/assigned-gpus"
"""Comma-separated GPU UUIDs chosen at bind time."""
ANNOTATION_ASSIGNED_AT = "baton.dev/assigned-at"
"""RFC 3339 time (nanoseconds) of the assignment."""
ANNOTATION_ALLOCATED_AT = "baton.dev/allocated-at"
"""RFC 3339 time the device plugin first saw the kubelet's allocation for the pod."""
ANNOTATION_CONTAINER_GPUS = "baton.dev/container-gpus"
"""JSON object: container name → sorted GPU UUIDs of the slots the kubelet allocated to it
(from its PodResources API; the device plugin writes it, the agent reads it)."""
ANNOTATION_PARKING = "baton.dev/parking"
"""Pod annotation: how its GPU memory is parked (`cuda`, `app` or `fake`); absent: the node
decides (its own callbacks if its session offers them, else the node's default)."""

# Scheduling.
SCHEDULER_NAME = "baton-scheduler"
NAMESPACE = "baton-system"
LABEL_GPU_NODE = "baton.dev/gpu-node"
"""Node label the node DaemonSets select (the nvidia overlay selects GPU feature discovery's)."""
LABEL_BENCH = "baton.dev/bench"
"""On every node and pod `baton bench schedule` makes, so it finds (and removes) exactly those."""
NODE_POD_SELECTOR = "app.kubernetes.io/name=baton-agent"
"""Label selector of the agent DaemonSet's pods (one per GPU node) in `NAMESPACE`."""

# Node paths.
AGENT_SOCKET = "/run/baton/agent.sock"
AGENT_SOCKET_DIR = "/run/baton"
AGENT_STATE_DIR = "/var/lib/baton"
AGENT_SESSION_METADATA = "baton-session"
"""gRPC metadata key carrying a tenant's session token."""
AGENT_WATCH_METADATA = "baton-watch"
"""gRPC metadata key carrying the watch token `WatchEvents` needs besides a session token."""
AGENT_WATCH_TOKEN_FILE = "watch-token"
"""The watch token's file in the agent's state directory (mode 0600, new at every start)."""
KUBELET_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
KUBELET_SOCKET_NAME = "kubelet.sock"
DEVICE_PLUGIN_SOCKET_NAME = "baton-gpu.sock"
KUBELET_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
"""The kubelet's PodResources API (v1): which devices each container was allocated."""

# Environment in tenant containers.
ENV_AGENT_SOCKET = "BATON_AGENT_SOCKET"
ENV_GPUS = "BATON_GPUS"
ENV_CLAIM_PREFIX = "BATON_CLAIM_"
"""A DRA claim's device `gpu-<index>` sets `BATON_CLAIM_GPU_<index>` to its GPU's UUID. CDI sets
a variable once per container, so a container naming several claims keeps one claim's
`BATON_GPUS`: the client adds these."""
ENV_NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ENV_TENANT_NAME = "BATON_TENANT_NAME"
"""Name a tenant registers under outside Kubernetes (default: host name and PID)."""

# Environment of the daemons (env twins shared by more than one command).
ENV_KUBECONFIG = "BATON_KUBECONFIG"
ENV_LOG_LEVEL = "BATON_LOG_LEVEL"

# Metrics and ports.
METRICS_PREFIX = "baton_"
PORT_AGENT = 9460
PORT_DEVICE_PLUGIN = 9461
PORT_EXTENDER = 9462
PORT_DRA = 9463
"""The DRA driver's metrics (and, with fake GPUs, fault injection) port."""
PORT_LLMD_ORCHESTRATOR = 50051
"""llm-d's TimeSlice Orchestrator port; `baton agent --llmd-listen` serves it and its agent's."""

# llm-d time-slicing compatibility (`agent/server/llmd`).
LABEL_PREFIX_LLMD = "timeslice.io/"
"""Pod labels of llm-d's time-slicing; the agent keeps these on its pod tenants."""
LABEL_LLMD_JOB = "timeslice.io/job-id"
LABEL_LLMD_GROUP = "timeslice.io/group"
ENV_LLMD_LISTEN = "BATON_AGENT_LLMD_LISTEN"
ENV_LLMD_GROUPS = "BATON_AGENT_LLMD_GROUPS"

# A job's turn across its pods and nodes (`coordinator/`, `agent/server/jobturns.py`).
LABEL_JOB = "baton.dev/job"
"""Pod label: the pods of one namespace that share it are one job, which takes one turn."""
ANNOTATION_AGENT_COORDINATION = "baton.dev/agent-coordination"
"""Node annotation: HOST:PORT where the node's agent serves the coordinator's job turns."""
PORT_AGENT_COORDINATION = 9464
"""The agent's job-turn service for the coordinator (`baton agent --coordination-listen`)."""
PORT_COORDINATOR = 9465
"""The coordinator's status and metrics port; it serves llm-d's API on `PORT_LLMD_ORCHESTRATOR`."""
COORDINATION_TOKEN_METADATA = "authorization"
"""gRPC metadata carrying `Bearer <token>` from the coordinator to the agents."""
COORDINATOR_LEASE = "baton-coordinator"
"""The `coordination.k8s.io` Lease in `NAMESPACE` whose holder leads the coordinators."""
ANNOTATION_FAIR_CLOCKS = "baton.dev/fair-clocks"
"""Lease annotation: the leading coordinator's fair-policy clocks, for the next leader."""
LABEL_COORDINATOR_LEADER = "baton.dev/coordinator-leader"
"""Pod label the leading coordinator puts on its own pod; the coordinator's Service selects it."""
ANNOTATION_COORDINATOR_LEADER_EPOCH = "baton.dev/coordinator-leader-epoch"
"""Pod annotation written with `LABEL_COORDINATOR_LEADER`: the epoch its leader leads in, so that
a newer leader removes the label of an older one (and never that of a newer one)."""
ANNOTATION_COORDINATOR_LEADER_LEASE = "baton.dev/coordinator-leader-lease"
"""Pod annotation written with `LABEL_COORDINATOR_LEADER`: the UID of the Lease its epoch counts in
(a Lease deleted and created again counts its epochs from 1 again)."""


def job_of_labels(labels: Mapping[str, str]) -> str:
    """The job a pod's labels name (`baton.dev/job`, else llm-d's `timeslice.io/job-id`), or ""."""
    return labels.get(LABEL_JOB) or labels.get(LABEL_LLMD_JOB) or ""


# The agent's accounting of GPU time (`agent/server/accounting.py`, `kubectl baton usage`).
DEPARTED = "(departed)"
"""A tenant gone from the node for longer than the agent's `--forget-departed-after` has its
totals folded into the pseudo-tenant `<namespace>/(departed)`; no tenant takes this name."""


def departed_tenant(namespace: str) -> str:
    """The pseudo-tenant holding the totals of `namespace`'s departed tenants."""
    return f"{namespace}/{DEPARTED}"


def is_departed_tenant(tenant_id: str) -> bool:
    """Whether `tenant_id` is a namespace's pseudo-tenant of departed tenants."""
    return tenant_id.endswith(f"/{DEPARTED}")


# Device plugin defaults.
DEFAULT_SLOTS_PER_GPU = 4
SLOT_SEPARATOR = "::"
"""Device IDs are `<GPU-UUID>::<slot>`."""

MIB = 1024 * 1024


def slot_device_id(gpu_uuid: str, slot: int) -> str:
    """The device ID the plugin advertises for one slot of one GPU."""
    return f"{gpu_uuid}{SLOT_SEPARATOR}{slot}"


def gpus_of_device_ids(device_ids: Iterable[str]) -> tuple[str, ...]:
    """The sorted, distinct GPU UUIDs of some slot device IDs: the GPUs of a container."""
    return tuple(sorted({gpu_of_device_id(d) for d in device_ids}))


def gpu_of_device_id(device_id: str) -> str:
    """The GPU UUID a slot device ID belongs to."""
    uuid, sep, _slot = device_id.rpartition(SLOT_SEPARATOR)
    if not sep or not uuid:
        raise ValueError(f"device ID {device_id!r} is not of the form <GPU-UUID>::<slot>")
    return uuid


# Fake GPUs (the `fake` evacuation backend and the tenants that use it).
ENV_FAKE_GPU_DIR = "BATON_FAKE_GPU_DIR"
DEFAULT_FAKE_GPU_DIR = "/dev/shm/baton-fake-gpus"
FAKE_GPU_UUID_PREFIX = "GPU-fake-"
ENV_NODE_NAME = "NODE_NAME"
"""This node's name (downward API); it also tells one node's simulated GPUs from another's."""


def fake_gpu_uuid(index: int, node_name: str = "") -> str:
    """The UUID of simulated GPU `index` on `node_name` (no node name: a local machine).

    The device plugin and the agent both name fake GPUs with this, so the UUIDs a tenant is
    given are the ones the agent knows; on a cluster each node's fake GPUs differ.
    """
    node = f"{node_name}-" if node_name else ""
    return f"{FAKE_GPU_UUID_PREFIX}{node}{index:04d}"


MAX_FAKE_GPUS = 64
"""The most simulated GPUs one node declares: the DRA driver publishes them in one
ResourceSlice, which holds at most 64 devices once one is tainted (an unhealthy GPU); a count
past it is a typo (`81920x2`), or one that would fill the memory with its list."""


class TooManyFakeGpus(ValueError):
    """A `--fake-gpus` declaration of more than `MAX_FAKE_GPUS` GPUs; the message says so."""


def fake_gpu_sizes(spec: str) -> list[int]:
    """MiB of each simulated GPU, in index order, from `COUNTxMIB` (2x81920) or `MIB,MIB,...`;
    `TooManyFakeGpus` past `MAX_FAKE_GPUS`, ValueError when it is neither."""
    count, x, mib = spec.strip().lower().partition("x")
    counted = bool(x) and count.strip().isdigit()
    if (int(count) if counted else spec.count(",") + 1) > MAX_FAKE_GPUS:
        raise TooManyFakeGpus(f"--fake-gpus {spec!r}: at most {MAX_FAKE_GPUS} GPUs per node")
    parts = [mib.strip()] * int(count) if counted else spec.split(",")
    sizes = [p.strip() for p in parts]
    if not sizes or not all(p.isdigit() and int(p) > 0 for p in sizes):
        raise ValueError(f"--fake-gpus {spec!r}: give COUNTxMIB (2x81920) or MIB,MIB,...")
    return [int(p) for p in sizes]


# Agent flags about parking memory (env twins of `baton agent` options).
ENV_AGENT_BACKEND = "BATON_AGENT_BACKEND"
ENV_FAKE_GPUS = "BATON_FAKE_GPUS"
ENV_FAKE_SCALE = "BATON_FAKE_SCALE"
ENV_PCIE_GBPS = "BATON_PCIE_GBPS"
ENV_HOST_MEMORY_BUDGET = "BATON_HOST_MEMORY_BUDGET"
ENV_HEADROOM = "BATON_HEADROOM"
ENV_MOVE_TIMEOUT = "BATON_MOVE_TIMEOUT"
ENV_DRIVER_CALL_TIMEOUT = "BATON_DRIVER_CALL_TIMEOUT"
ENV_SLOWEST_COPY_GBPS = "BATON_SLOWEST_COPY_GBPS"

# The DRA path (Kubernetes >= 1.34): the `baton dra` driver.
DRA_DRIVER = "gpu.baton.dev"
"""Driver name in ResourceSlices and claims' results; the DeviceClass has the same name."""
DRA_DEVICE_CLASS = "gpu.baton.dev"
DRA_CAPACITY_MEMORY = "memory"
"""Consumable capacity: bytes of device memory a tenant needs during its turn."""
DRA_CAPACITY_DUTY = "duty"
"""Consumable capacity: percent of the GPU's time (100 per GPU)."""
DRA_CAPACITY_SLOTS = "slots"
"""Consumable capacity: tenants per GPU (each share takes one)."""
DRA_ATTRIBUTE_UUID = "uuid"
"""Device attribute: the GPU's UUID (also `index`, `model`, `memory`)."""
DRA_DEVICE_PREFIX = "gpu-"
"""Device names are `gpu-<index>`."""
KUBELET_PLUGINS_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
KUBELET_PLUGINS_DIR = "/var/lib/kubelet/plugins"
CDI_SPEC_DIR = "/var/run/cdi"
CDI_KIND_CLAIM = "baton.dev/claim"
"""CDI kind of the per-claim specs the driver writes; IDs are `baton.dev/claim=<uid>-<device>`."""
DRA_STATE_DIR = "/var/lib/baton/dra"
"""The driver's record of prepared claims (host path, survives its restarts)."""

ANOTHER_NAMESPACES_JOB = "a job of another namespace"
"""How the llm-d APIs (the node agent's, the coordinator's) name a job to a caller of another
namespace: its name and namespace are that namespace's."""


def dra_device_name(index: int) -> str:
    """The DRA device name of GPU `index` in the node's ResourceSlice."""
    return f"{DRA_DEVICE_PREFIX}{index}"


_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_OBJECT_NAMES = {
    False: (re.compile(_LABEL), 63, "'-'"),  # a DNS label: a namespace's name
    True: (re.compile(rf"{_LABEL}(\.{_LABEL})*"), 253, "'-', '.'"),  # a DNS subdomain: a pod's
}


def name_problem(what: str, name: str, dotted: bool = False) -> str | None:
    """Why `name` cannot name a Kubernetes `what` (`dotted`: a DNS subdomain such as a pod's,
    node's or Lease's name, else a DNS label such as a namespace's), or None: the API server
    would refuse every call about it, and a name goes into an API path as it is."""
    pattern, limit, marks = _OBJECT_NAMES[dotted]
    if len(name) <= limit and pattern.fullmatch(name):
        return None
    return (
        f"{what} {name!r} is not a Kubernetes name (lower-case letters, digits, {marks}; a "
        f"letter or digit first and last; at most {limit} characters)"
    )
