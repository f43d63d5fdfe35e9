"""Tenants cannot reach each other through the agent; pods get the agent socket and no more.

The intruder runs under another UID (`tests/reliability/intruder.py` drops to it after start).
Outside Kubernetes the agent runs with its defaults; as deployed, with the socket mode, flags
and environment the built manifests give it (`tests/reliability/deployed.py`).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.client import Baton
from agent.core.events import Event
from agent.wire.handshake import handshake_path
from baton.contract import names
from nodegpu.container import container_allocation
from tests.agent.node.test_podwatch import pod
from tests.harness.agent import ROOT, AgentRunner, TenantProcess
from tests.harness.fakeapi import FakeApiServer

from .deployed import AGENT_OVERLAYS, deployed_agent_config
from .figures import record

pytestmark = pytest.mark.timeout(60)
VICTIM_GPU, INTRUDER_GPU = "GPU-0", "GPU-1"


@pytest.fixture
def agent() -> Iterator[AgentRunner]:
    runner = AgentRunner().start()
    os.chmod(runner.workdir, 0o755)  # others may reach the socket; its own mode decides
    yield runner
    runner.stop()


def intrude(
    agent: AgentRunner, uid: int, gid: int, lease_id: str, in_pod: str | None = None
) -> dict[str, Any]:
    """Run the intruder as `uid`:`gid`, in the pod `in_pod` (by its cgroup) or in none."""
    argv = [
        sys.executable, "-m", "tests.reliability.intruder", agent.socket, str(uid), str(gid),
        "intruder", INTRUDER_GPU, "victim", lease_id, VICTIM_GPU,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        if in_pod is not None:
            place_in_pod(Path(agent.config.proc_root), proc.pid, in_pod)
        out, err = proc.communicate("go\n", timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err[-2000:]
    return dict(json.loads(out.splitlines()[-1]))


def place_in_pod(proc_root: Path, pid: int, pod_uid: str) -> None:
    """What the kernel shows in /proc/<pid>/cgroup for a container of the pod."""
    (proc_root / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc_root / str(pid) / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-pod{pod_uid.replace('-', '_')}.slice/cri-containerd-1.scope\n"
    )


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
        "watch": "PERMISSION_DENIED",
        "watch_guessed_token": "PERMISSION_DENIED",
    }
    assert [x for x in after[0] if x[1] == "local/victim"] == before[0]
    assert [t for t in after[1] if t[0] == "local/victim"] == [("local/victim", 0, (VICTIM_GPU,))]
    record("security", "another tenant's turn through the agent socket", {"refused": len(said)})


@pytest.mark.skipif(os.getuid() != 0, reason="running a process under another UID needs root")
def test_the_sockets_keep_out_processes_outside_the_owner_and_group(agent):
    """Promised: by default (outside Kubernetes) the gRPC and handshake sockets are mode 0660;
    a process of another UID and group cannot even connect."""
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


VICTIM_POD, INTRUDER_POD = (
    "7a1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b",
    "8b1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b",
)


@pytest.fixture(params=AGENT_OVERLAYS)
def deployed(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[tuple[AgentRunner, str, str]]:
    """An agent run with a built manifest's settings, serving two pods (victim, intruder) of a
    fake API server; the test process is the victim pod's container, holding its GPU."""
    config = deployed_agent_config(request.param, monkeypatch, tmp_path)
    assert config.node_name, f"{request.param}: the deployed agent does not serve pods"
    proc = tmp_path / "proc"
    place_in_pod(proc, os.getpid(), VICTIM_POD)
    with FakeApiServer() as api:
        node = config.node_name
        api.put_object(pod("victim", VICTIM_POD, node, VICTIM_GPU))
        api.put_object(pod("intruder", INTRUDER_POD, node, INTRUDER_GPU))
        agent = AgentRunner(
            socket_mode=config.socket_mode,
            node_name=node,
            allow_local_tenants=config.allow_local_tenants,
            kubeconfig=str(api.kubeconfig_path(tmp_path)),
            proc_root=str(proc),
        ).start()
        os.chmod(agent.workdir, 0o755)  # others may reach the socket; its own mode decides
        victim = Baton(agent.socket, connect_timeout=5)
        try:
            for tenant in ("team/victim", "team/intruder"):  # both pods seen by the watch
                agent.wait_event(joined(tenant), 30)
            lease_id = victim.acquire().lease_id
            yield agent, lease_id, f"manifests/{request.param}".rstrip("/.")
        finally:
            victim.close()
            agent.stop()


def joined(tenant: str) -> Callable[[Event], bool]:
    """Matches the event of `tenant` joining."""
    return lambda e: e.kind == "tenant_joined" and e.tenant_id == tenant


def victims_lease(agent: AgentRunner) -> Any:
    return [x for x in snapshot(agent)[0] if x[1] == "team/victim"]


@pytest.mark.skipif(os.getuid() != 0, reason="running a process under another UID needs root")
def test_as_deployed_a_process_in_no_pod_gets_nothing_even_as_root(deployed):
    """Promised, with the manifests' socket mode and flags: a process on the node that is in no
    Baton pod, root or not, cannot register, act on the victim's lease or watch the events; a
    socket open to others does not change that (identity comes from SO_PEERCRED)."""
    agent, lease_id, built = deployed
    before = victims_lease(agent)
    mode = agent.config.socket_mode
    for path in (agent.socket, handshake_path(agent.socket)):
        assert stat.S_IMODE(os.stat(path).st_mode) == mode, "the socket is not as deployed"
    refused = {
        "yield": "FAILED_PRECONDITION",
        "renew": "FAILED_PRECONDITION",
        "inspect": "FAILED_PRECONDITION",
        "acquire_its_gpu": "FAILED_PRECONDITION",
        "join_its_tenant": "PERMISSION_DENIED",
        "forged_token": "UNAUTHENTICATED",
        "no_token": "UNAUTHENTICATED",
        "watch": "PERMISSION_DENIED",
        "watch_guessed_token": "PERMISSION_DENIED",
    }
    if agent.config.allow_local_tenants:
        pytest.fail("the deployed agent lets processes in no pod register as local tenants")
    tried = 0
    for uid, gid in ((0, 0), (1002, 1002)):
        said = intrude(agent, uid, gid, lease_id)
        tried += 1
        if uid and not mode & 0o006:
            assert said == {"connect": "EACCES"}
            continue
        assert said.pop("uid") == uid
        assert said == {"tenant": "PERMISSION_DENIED", **refused}, f"as UID {uid}"
    assert victims_lease(agent) == before
    record("security", f"{built} agent (mode {mode:04o}), process in no pod", {"uids": tried})


@pytest.mark.skipif(os.getuid() != 0, reason="running a process under another UID needs root")
def test_as_deployed_a_tenant_pod_cannot_touch_another_pods_turn(deployed):
    """Promised, with the manifests' settings: a process of another pod, under another UID,
    is its own pod's tenant and nothing more: it cannot end, renew or read the victim's lease,
    take its GPU, join its tenant or watch the events."""
    agent, lease_id, built = deployed
    before = victims_lease(agent)
    said = intrude(agent, 1002, 1002, lease_id, in_pod=INTRUDER_POD)
    if not agent.config.socket_mode & 0o006:
        pytest.fail("the deployed socket mode keeps tenants of other UIDs out of the agent")
    assert said.pop("uid") == 1002
    assert said == {
        "tenant": "team/intruder",
        "yield": "PERMISSION_DENIED",
        "renew": "PERMISSION_DENIED",
        "inspect": "PERMISSION_DENIED",
        "acquire_its_gpu": "INVALID_ARGUMENT",
        "join_its_tenant": "team/intruder",
        "forged_token": "UNAUTHENTICATED",
        "no_token": "UNAUTHENTICATED",
        "watch": "PERMISSION_DENIED",
        "watch_guessed_token": "PERMISSION_DENIED",
    }
    assert victims_lease(agent) == before
    refused = [what for what, answer in said.items() if answer != "team/intruder"]
    record("security", f"{built} agent, another pod's tenant", {"refused": len(refused)})
