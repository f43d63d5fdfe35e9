"""The node agent's one composition root: `build_agent(config)` makes every part from one config.

State, lease service, preparer and backend are built here and nowhere else, into an `Agent`
(`agent.daemon`) that opens the gRPC and direct sessions, HTTP status and metrics, llm-d's
services and the pod watch as it starts; `baton agent` (`run_agent`), the demo and the test
harnesses all go through `build_agent`. What it can be told is `AgentConfig` (`agent.config`).
The preparer is built with the lease service as its `ParkingHost` (`agent.parking.host`), so
parking never reaches up into the server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.config import AgentConfig, AgentStartError
from agent.core.clock import steady_wall_clock
from agent.core.fair import FairShare
from agent.core.leases import LeaseTable
from agent.core.residency import TurnPreparer
from agent.daemon import Agent
from agent.node.identity import TokenRegistry
from agent.node.state import StateStore
from agent.node.statelock import holding
from agent.node.watchtoken import write_watch_token
from agent.parking.backends.base import Backend, BackendUnavailable
from agent.parking.host import ParkingHost
from agent.parking.methods import NONE
from agent.parking.metrics import Forward
from agent.parking.setup import build_backend, build_preparer
from agent.server.service import LeaseService
from agent.server.sessions import SessionRegistry
from baton.contract.shutdown import StopSignal, on_stop_signal_async

__all__ = ["Agent", "AgentConfig", "AgentStartError", "build_agent", "run_agent"]

log = logging.getLogger(__name__)


def build_agent(
    config: AgentConfig,
    *,
    preparer: TurnPreparer | None = None,
    backend: tuple[Backend, Mapping[str, int]] | None = None,
) -> Agent:
    """The whole agent for `config`, not yet serving; call it on the loop that will run it.

    Test seams: `preparer` replaces the residency layer `config.parking` names, `backend` (a
    backend and its GPU memory) the backend it parks through. Raises `BackendUnavailable`,
    `StateDirError`, `KubeConfigError` or `AgentStartError` (what is missing, what to pass).
    """
    loop = asyncio.get_running_loop()
    sessions = SessionRegistry()
    opts = config.parking
    if preparer is None and backend is None and opts.backend != NONE:
        try:
            backend = build_backend(opts, sessions.call_tenant, loop)
        except ValueError as exc:  # e.g. a malformed --fake-gpus
            raise BackendUnavailable(str(exc)) from None
    store = StateStore(config.state_dir)
    watch_token = write_watch_token(config.state_dir)
    api_client = _pods_api_client(config)

    def make_preparer(host: ParkingHost) -> TurnPreparer:
        return preparer or build_preparer(opts, host, backend)

    order = FairShare(config.fair) if config.queue_policy == "fair" else config.queue_policy
    clock = steady_wall_clock()  # a step of the wall clock moves no deadline (agent.core.clock)
    table = LeaseTable(clock=clock, policy=order, max_hold=config.max_hold)
    service = LeaseService(
        table=table,
        preparer=make_preparer,
        clock=clock,
        store=store,
        reconnect_grace=config.reconnect_grace,
        forget_departed_after=config.forget_departed_after,
        policy_name=config.queue_policy,
        sessions=sessions,
    )
    if service.parking is not None:
        service.metrics.registry.register(Forward(service.parking.metrics.registry))
    tokens = TokenRegistry(loop.call_later)
    return Agent(config, service, tokens, watch_token, api_client)


def _pods_api_client(config: AgentConfig) -> Any:
    """With a node name: the API client for the pod watch, once `/proc` is checked."""
    if not config.node_name:
        return None
    if not Path(config.proc_root).is_dir():
        raise AgentStartError(
            f"the host's /proc is not at {config.proc_root}: without it no caller can be "
            "matched to its pod; pass --proc-root (BATON_PROC_ROOT)"
        )
    from baton.contract.kube import load_api_client

    return load_api_client(config.kubeconfig)


async def run_agent(config: AgentConfig, early: StopSignal | None = None) -> None:
    """Build and run an agent until SIGTERM or SIGINT (or cancellation); then stop it cleanly.
    It holds its state directory meanwhile (`agent.node.statelock`): a second agent given it is
    refused with `StateDirError` before it reads or writes anything there. A signal `early`
    caught before this one's handlers (while it loaded and built) stops it as it starts."""
    with holding(config.state_dir):
        agent = build_agent(config)
        on_stop_signal_async(asyncio.get_running_loop(), agent.request_stop)
        if early is not None and early.received:
            agent.request_stop(early.received)
        try:
            await agent.start()
        except BaseException:
            await agent.stop()  # close whatever opened before the failure
            raise
        try:
            await agent.wait()
        finally:
            await agent.stop()
        log.info(
            "agent stopped on %s; tenants, leases and parked memory kept in %s",
            agent.readiness.stopping or "cancellation",
            config.state_dir,
        )
