"""Tenants cannot reach each other through the agent; pods get the agent socket and no more.

The intruder runs under another UID (`tests/reliability/intruder.py` drops to it after start).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.wire.handshake import handshake_path
from baton import names
from deviceplugin.devices import container_allocation
from tests.harness.agent import ROOT, AgentRunner, TenantProcess

from .figures import record

pytestmark = pytest.mark.timeout(60)
VICTIM_GPU, INTRUDER_GPU = "GPU-0", "GPU-1"


@pytest.fixture
def agent() -> Iterator[AgentRunner]:
    runner = AgentRunner().start()
    os.chmod(runner.workdir, 0o755)  # others may reach the socket; its own mode decides
    yield runner
    runner.stop()


def intrude(agent: AgentRunner, uid: int, gid: int, lease_id: str) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "tests.reliability.intruder", agent.socket, str(uid), str(gid),
        "intruder", INTRUDER_GPU, "victim", lease_id, VICTIM_GPU,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.splitlines()[-1]))


def snapshot(agent: AgentRunner) -> Any:
    return agent.inspect(
        lambda s: (
            sorted(
                (lease.lease_id, lease.tenant_id, lease.gpus) for lease in s.table.leases.values()
            ),
            sorted((t.tenant_id, t.uid, tuple(t.gpus)) for t in s.tenants.tenants.values()),
        )
    )


@pytest.mark.skipif(os.getuid() != 0, reason="running a process under another UID needs root")
def test_a_tenant_of_another_uid_cannot_yield_renew_inspect_or_join_anothers_turn(agent):
    """Promised: through the socket, a tenant under another UID cannot end, renew or read the
    victim's lease, take the victim's GPU, join the victim's tenant, or act with a forged or
    missing token; the victim's lease is untouched."""
    victim = TenantProcess(agent.socket, "victim", [VICTIM_GPU])
    try:
        lease_id = victim.request("acquire")["lease_id"]
        before = snapshot(agent)
        said = intrude(agent, 1002, 0, lease_id)
        after = snapshot(agent)
        assert victim.request("yield") == {"ok": True}
    finally:
        victim.close()
    assert said.pop("tenant") == "local/intruder" and said.pop("uid") == 1002
    assert said == {
        "yield": "PERMISSION_DENIED",
        "renew": "PERMISSION_DENIED",
        "inspect": "PERMISSION_DENIED",
        "acquire_its_gpu": "INVALID_ARGUMENT",
        "join_its_tenant": "PERMISSION_DENIED",
        "forged_token": "UNAUTHENTICATED",
        "no_token": "UNAUTHENTICATED",
    }
    assert [x for x in after[0] if x[1] == "local/victim"] == before[0]
    assert [t for t in after[1] if t[0] == "local/victim"] == [("local/victim", 0, (VICTIM_GPU,))]
    record("security", "another tenant's turn through the agent socket", {"refused": len(said)})


@pytest.mark.skipif(os.getuid() != 0, reason="running a process under another UID needs root")
def test_the_sockets_keep_out_processes_outside_the_owner_and_group(agent):
    """Promised: the gRPC and handshake sockets are mode 0660; a process of another UID and
    group cannot even connect."""
    for path in (agent.socket, handshake_path(agent.socket)):
        mode = os.stat(path).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o660, oct(mode)
    assert intrude(agent, 1003, 1003, "none") == {"connect": "EACCES"}
    record("security", "agent socket mode 0660", {"outsider_connect": "EACCES"})


def test_the_socket_directory_holds_only_the_agent_sockets(agent):
    """Promised: what tenant pods get mounted (the socket's directory) holds nothing but the
    agent's two sockets: no state, no tenant memory."""
    socket_dir = Path(agent.socket).parent
    harness_state = Path(agent.config.state_dir).name  # the harness keeps it beside; not a node
    entries = {p.name for p in socket_dir.iterdir()} - {harness_state}
    assert entries == {Path(agent.socket).name, Path(handshake_path(agent.socket)).name}


def pod_specs(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        spec = doc.get("spec", {})
        template = spec.get("jobTemplate", {}).get("spec", spec).get("template")
        if template:
            yield f"{path.name}:{doc['metadata']['name']}", template["spec"]
        elif doc.get("kind") == "Pod":
            yield f"{path.name}:{doc['metadata']['name']}", spec


def test_tenant_pods_get_the_agent_socket_directory_and_nothing_else_of_the_host():
    """Promised: the example tenant workloads ask for no host path, host namespace, privilege or
    capability; the device plugin gives each tenant container the agent socket directory,
    read-only, and no other host path."""
    tenants = [
        (where, spec)
        for path in sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
        for where, spec in pod_specs(path)
        if spec.get("schedulerName") == names.SCHEDULER_NAME
    ]
    assert tenants, "no tenant pod templates found under manifests/examples"
    for where, spec in tenants:
        assert not any(spec.get(k) for k in ("hostPID", "hostIPC", "hostNetwork")), where
        assert not [v for v in spec.get("volumes", []) if "hostPath" in v], where
        for c in spec["containers"] + spec.get("initContainers", []):
            ctx = c.get("securityContext", {})
            assert not ctx.get("privileged") and not ctx.get("capabilities", {}).get("add"), where
    allocation = container_allocation(["GPU-a", "GPU-b"])
    assert allocation.mounts == ((names.AGENT_SOCKET_DIR, names.AGENT_SOCKET_DIR, True),)
    assert Path(names.AGENT_SOCKET).parent == Path(names.AGENT_SOCKET_DIR)
    assert not Path(names.AGENT_STATE_DIR).is_relative_to(names.AGENT_SOCKET_DIR)
    record("security", "tenant pod host access", {"pod_templates": len(tenants)})
