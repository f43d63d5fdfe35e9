"""The agent's `/readyz` as a probe meets it: 503 with one line saying why the agent cannot serve
tenants (stopping, the node's pods not listed yet, a socket gone), while `/healthz` stays 200."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from agent.client import AsyncBaton
from agent.wire.handshake import handshake_path
from tests.agent.node.test_podwatch import UID, pod
from tests.e2e.processes import poll
from tests.harness.agent import AgentRunner
from tests.harness.fakeapi import FakeApiServer

pytestmark = pytest.mark.timeout(60)


def test_a_serving_agent_is_ready(agent: AgentRunner) -> None:
    assert agent.http("/readyz") == (200, "ready\n")


def test_an_agent_told_to_stop_is_not_ready_and_says_so(agent: AgentRunner) -> None:
    async def sigterm() -> None:
        agent.agent.request_stop("SIGTERM")

    agent.call(sigterm())
    assert agent.http("/readyz") == (
        503,
        "not ready: the agent is stopping on SIGTERM: it takes no new sessions; tenants, "
        "turns and parked memory are kept for the next agent\n",
    )
    assert agent.http("/healthz") == (200, "ok\n")


def test_an_agent_draining_its_sessions_answers_not_ready(workdir: str) -> None:
    """While `stop` waits (up to the shutdown grace) for a gRPC session to end, /readyz still
    answers, 503 stopping, instead of the probe meeting a closed port."""
    runner = AgentRunner(workdir, shutdown_grace=30).start()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def on_tenant_loop(coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, loop).result(20)

    tenant = AsyncBaton(runner.socket, ["GPU-0"], name="t", transport="grpc", reconnect=False)
    stopper = threading.Thread(target=runner.stop)
    try:
        on_tenant_loop(tenant.connect())
        stopper.start()
        code, body = poll(
            "/readyz answering 503",
            lambda: answer if (answer := runner.http("/readyz"))[0] != 200 else None,
            10,
        )
        assert (code, body) == (
            503,
            "not ready: the agent is stopping: it takes no new sessions; tenants, turns and "
            "parked memory are kept for the next agent\n",
        )
        assert stopper.is_alive(), "stop did not wait for the gRPC session"
        assert runner.http("/healthz") == (200, "ok\n")
    finally:
        on_tenant_loop(tenant.close())
        if stopper.ident is None:
            runner.stop()
        else:
            stopper.join(40)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.mark.parametrize("which", ["agent socket", "handshake socket"])
def test_a_socket_gone_from_the_filesystem_makes_the_agent_not_ready(
    agent: AgentRunner, which: str
) -> None:
    path = agent.socket if which == "agent socket" else handshake_path(agent.socket)
    os.unlink(path)
    code, body = agent.http("/readyz")
    assert code == 503
    assert body == (
        f"not ready: the socket {path} is gone from the filesystem (was it or its directory "
        "deleted on the host?): tenants cannot connect; restart the agent to listen there again\n"
    )
    assert agent.http("/healthz") == (200, "ok\n")


def test_a_socket_replaced_by_another_file_makes_the_agent_not_ready(agent: AgentRunner) -> None:
    os.unlink(agent.socket)
    Path(agent.socket).write_text("not a socket")
    code, body = agent.http("/readyz")
    assert code == 503
    assert f"the socket {agent.socket} is no longer the one this agent listens on" in body


@pytest.mark.parametrize("which", ["agent socket", "handshake socket"])
def test_a_socket_given_another_mode_or_owner_is_still_the_agents_own(
    agent: AgentRunner, which: str
) -> None:
    """An operator's chmod or chown on the host changes the socket's ctime, not the socket: the
    agent stays ready, serves on it, and removes it as it stops."""
    path = agent.socket if which == "agent socket" else handshake_path(agent.socket)
    os.chmod(path, 0o666)
    os.chown(path, os.getuid(), os.getgid())
    assert agent.http("/readyz") == (200, "ready\n")
    agent.stop()
    assert not os.path.exists(path), f"the agent left its {which} behind as it stopped"


def test_serving_pods_the_agent_is_ready_once_the_nodes_pods_are_listed(
    workdir: str, tmp_path: Path
) -> None:
    """Started while the API server is down: 503 naming the node until the pod watch has listed
    its pods; once ready, the listed pods' tenants are known."""
    (tmp_path / "proc").mkdir()
    api = FakeApiServer().start()
    api.put_object(pod("trainer", UID, "node-1", "GPU-a"))
    kubeconfig = str(api.kubeconfig_path(tmp_path))
    api.stop()
    runner = AgentRunner(
        workdir, node_name="node-1", kubeconfig=kubeconfig, proc_root=str(tmp_path / "proc")
    )
    try:
        runner.start()
        assert runner.http("/readyz") == (
            503,
            "not ready: node node-1's pods are not listed yet (the API server has not answered "
            "the pod watch): a tenant in a pod cannot be identified until they are\n",
        )
        assert runner.http("/healthz") == (200, "ok\n")
        api.start()
        poll("/readyz answering 200", lambda: runner.http("/readyz")[0] == 200 or None, 30)
        assert set(runner.status()["tenants"]) == {"team/trainer"}
    finally:
        runner.stop()
        api.stop()
