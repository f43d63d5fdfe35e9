"""What `baton agent` can be told (`AgentConfig`), and the error it refuses to start with."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.core.fair import FairConfig
from agent.core.policy import DEFAULT_QUEUE_POLICY
from agent.parking.setup import ParkingOptions
from baton.contract import names


class AgentStartError(Exception):
    """Something the agent needs at start is missing or unusable; the message says what."""


@dataclass
class AgentConfig:
    """Everything `baton agent` can be told."""

    socket: str = names.AGENT_SOCKET
    state_dir: str = names.AGENT_STATE_DIR
    http_host: str = "0.0.0.0"
    http_port: int = names.PORT_AGENT
    debug_tcp_port: int = 0
    """Also serve gRPC on 127.0.0.1:<port> (0 = off). Calls still need a handshake token."""
    queue_policy: str = DEFAULT_QUEUE_POLICY
    """Who is served next on a GPU: `fifo`, `lrs` (`agent.core.policy`) or `fair`."""
    fair: FairConfig = field(default_factory=FairConfig)
    """With `fair`: the lower tiers' minimum share, the credit bound, the tier revoke grace."""
    max_hold: float = 60.0
    reconnect_grace: float = 10.0
    forget_departed_after: float = 3600.0
    """Seconds before a departed tenant's totals fold into `<namespace>/(departed)`; 0 = never."""
    socket_mode: int = 0o660
    node_name: str = ""
    """In Kubernetes: this node's name; tenants are then learned from a watch of its pods."""
    allow_local_tenants: bool = False
    """With `node_name`: let processes in no pod register too (always allowed without one)."""
    kubeconfig: str | None = None
    proc_root: str = "/proc"
    """Where the host's /proc is (PID → cgroup → pod); the agent runs with hostPID."""
    shutdown_grace: float = 0.2
    """Seconds in-flight RPCs get to finish on `stop` before they are cancelled."""
    llmd_listen: str = ""
    """Also serve llm-d's time-slicing API on HOST:PORT, plaintext ("" = off)."""
    llmd_groups: tuple[str, ...] = ()
    """llm-d groups outside Kubernetes: `NAME=GPU[,GPU...]` each."""
    llmd_forget_idle_after: float = 3600.0
    """Seconds no llm-d call names a job used only by callers whose process the agent cannot
    find (another host), with no turn, wait or parked memory, before it leaves; 0 = never."""
    parking: ParkingOptions = field(default_factory=ParkingOptions)
    """The backend that parks memory (`none` by default) and its settings."""
    coordination_listen: str = ""
    """Serve the coordinator's job turns on HOST:PORT ("" = off; needs the token)."""
    coordination_token: str = ""
    """The token the coordinator's calls carry (from the Secret both mount)."""
    coordination_advertise: str = ""
    """HOST:PORT the coordinator dials, written to the node's annotation (needs `node_name`)."""
    coordinator: str = ""
    """HOST:PORT of the coordinator (its Service): job members' own acquires go there."""
