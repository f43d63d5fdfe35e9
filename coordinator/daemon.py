"""`baton coordinator`: the one place the coordinator's parts are built and started.

Watches (job pods under either job label, nodes) feed the cluster view; the leader elector
campaigns for the Lease; when this replica leads it recovers the agents' turns (with its new
epoch) before it serves, then asks the agents it did not reach again until they answer, and
those the view lists later as they appear; when it stops leading every waiter hears why.
llm-d's orchestrator API and the gRPC health service are served by every replica; only the
leader grants (a standby answers UNAVAILABLE, and where it runs in a pod the leader labels its
own pod so that the Service sends calls to it alone).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import grpc

from agent.core.clock import steady_wall_clock
from agent.core.fair import FairShare
from agent.core.leases import LeaseTable
from baton._pb import health_pb2 as hp
from baton._pb import health_pb2_grpc as hp_grpc
from baton._pb import jobturns_pb2 as jt
from baton._pb import jobturns_pb2_grpc as jt_grpc
from baton._pb import timeslice_orchestrator_pb2 as ts
from baton._pb import timeslice_orchestrator_pb2_grpc as ts_grpc
from baton.contract import names
from baton.contract.kube import Outage
from baton.contract.reflector import KubeSource, Reflector
from baton.contract.shutdown import StopSignal, on_stop_signal_async
from baton.contract.statushttp import StatusServer
from baton.contract.tcpbind import bind_error, served_at
from coordinator import fairstate
from coordinator.agents import AgentLinks
from coordinator.callers import PodCallers
from coordinator.cluster import ClusterView, NodeStore, PodStore
from coordinator.jobs_api import JobsServicer
from coordinator.leader import LeaderElector
from coordinator.llmd import LlmdOrchestrator
from coordinator.podlabel import LeaderLabel, Term
from coordinator.recovery import chase, recover
from coordinator.status import CoordinatorMetrics, readiness, status_json, watch
from coordinator.turns import Arbiter

log = logging.getLogger(__name__)


LIST_WAIT_S = 30.0
"""How long a new leader waits for its watches' first lists before it recovers the agents'
turns (it knows only the nodes and job pods they list)."""


class CoordinatorStartError(Exception):
    """Something the coordinator needs at start is missing; the message says what to pass."""


@dataclass
class CoordinatorConfig:
    """Everything `baton coordinator` can be told."""

    token: str
    """The coordination token the agents expect (from the Secret both mount)."""
    kubeconfig: str | None = None
    namespace: str = names.NAMESPACE
    """Where the Lease lives."""
    lease_name: str = names.COORDINATOR_LEASE
    identity: str = ""
    """This replica's name in the Lease (default: the host name)."""
    llmd_listen: str = f"0.0.0.0:{names.PORT_LLMD_ORCHESTRATOR}"
    http_listen: str = f"0.0.0.0:{names.PORT_COORDINATOR}"
    """/healthz, /readyz (200 while leading), /metrics and /v1/status."""
    queue_policy: str = "fifo"
    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    prepare_timeout_s: float = 60.0
    allow_unidentified: bool = False
    """Let callers that are no identifiable pod drive the one namespace that has their job."""
    pod_name: str = ""
    pod_namespace: str = ""
    """This replica's own pod, labelled while it leads (empty outside a pod)."""


class Coordinator:
    """Build with a config and an API client; `start`, then `stop`."""

    def __init__(self, config: CoordinatorConfig, api_client: Any) -> None:
        self.config = config
        self._api = api_client
        self.view = ClusterView()
        self.identity = config.identity or socket.gethostname()
        self.links = AgentLinks(config.token, holder=self.identity)
        # Turns are timed as on the agents: wall time that a step of the wall clock does not move
        # while this replica runs, else a step would be charged to the jobs holding turns then.
        self.clock = steady_wall_clock(time.time, time.monotonic)
        self.arbiter = Arbiter(self.view, self.links, self._new_table, self.clock)
        self.arbiter.prepare_timeout_s = config.prepare_timeout_s
        self.metrics = CoordinatorMetrics()
        watch(self.metrics, self.arbiter)
        self._http: StatusServer | None = None
        self.http_port = 0
        self._reflectors: list[Reflector] = []
        self._watches: list[tuple[Outage, threading.Event]] = []
        """Each watch's outage and the event its first list sets (`/readyz` names the others)."""
        self._elector: LeaderElector | None = None
        self._server: grpc.aio.Server | None = None
        self._health = _Health()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._term: asyncio.Task[None] | None = None
        self._agents_appeared = asyncio.Event()
        """Set when an agent's address appears in the view (the leader asks that agent)."""
        self._label: LeaderLabel | None = None
        if config.pod_name and config.pod_namespace:
            self._label = LeaderLabel.on_pod(
                api_client, config.pod_namespace, config.pod_name, self._holds
            )
        self.port = 0

    def _new_table(self) -> LeaseTable:
        policy = FairShare() if self.config.queue_policy == "fair" else self.config.queue_policy
        return LeaseTable(clock=self.clock, policy=policy, max_hold=float("inf"))

    async def start(self) -> None:
        """Watch, serve, campaign. Raises `CoordinatorStartError` before serving if it cannot."""
        self._loop = loop = asyncio.get_running_loop()

        def pods_changed() -> None:
            loop.call_soon_threadsafe(self.arbiter.prune_joined)

        def agents_changed() -> None:
            loop.call_soon_threadsafe(self._agents_appeared.set)

        self.view.on_pods_changed = pods_changed
        self.view.on_agents_changed = agents_changed
        callers = PodCallers(self._api)
        self.view.on_pod_seen = callers.saw
        self.view.on_pods_relisted = callers.relisted
        if self._label is not None:
            self._label.start()  # not leading (yet): a mark a crashed leader left here goes
        self._watch()
        self._server = grpc.aio.server()
        try:
            self.port = self._server.add_insecure_port(self.config.llmd_listen)
        except RuntimeError:
            self.port = 0
        if not self.port:
            why = bind_error(self.config.llmd_listen)
            raise CoordinatorStartError(
                f"cannot listen on {self.config.llmd_listen} ({why}); check --llmd-listen"
            )
        orchestrator = LlmdOrchestrator(
            self.arbiter, self.view, callers.namespace, self.config.allow_unidentified
        )
        ts_grpc.add_TimeSliceOrchestratorServiceServicer_to_server(orchestrator, self._server)
        jt_grpc.add_JobsServicer_to_server(
            JobsServicer(self.arbiter, self.config.token), self._server
        )
        hp_grpc.add_HealthServicer_to_server(self._health, self._server)
        await self._server.start()
        cfg = self.config
        arbiter, identity = self.arbiter, self.identity
        self._http = StatusServer(
            self.metrics.registry,
            lambda: status_json(arbiter, identity, bool(arbiter.epoch), self.clock()),
            self._not_ready,
        )
        host, _, port = cfg.http_listen.rpartition(":")
        try:
            self.http_port = await self._http.start(host or "0.0.0.0", int(port))
        except (OSError, ValueError) as exc:
            raise CoordinatorStartError(
                f"cannot serve status on {cfg.http_listen} ({exc}); check --http-listen"
            ) from None
        self._elector = LeaderElector(
            self._api,
            cfg.namespace,
            cfg.lease_name,
            self.identity,
            cfg.lease_duration_s,
            cfg.renew_deadline_s,
            cfg.retry_period_s,
            on_started_leading=self._started_leading,
            on_stopped_leading=self._stopped_leading,
            annotate=self._fair_clocks,
        )
        self._elector.start()
        log.info(
            "coordinator %s: llm-d API on %s, status on %s, policy %s, "
            "campaigning for Lease %s/%s",
            self.identity, served_at(cfg.llmd_listen, self.port),
            served_at(cfg.http_listen, self.http_port), cfg.queue_policy, cfg.namespace,
            cfg.lease_name,
        )  # fmt: skip

    def _not_ready(self) -> str | None:
        """Why this replica grants no job turns now (`/readyz`), or None while it leads with
        every watch listed (an API server that refuses it is named)."""
        elector = self._elector
        return readiness(
            self.arbiter.epoch,
            elector is not None and elector.is_leader(),
            f"Lease {self.config.namespace}/{self.config.lease_name}",
            elector.failing if elector is not None else "",
            {o.what: o.last for o, listed in self._watches if not listed.is_set()},
        )

    def _watch(self) -> None:
        for label in (names.LABEL_JOB, names.LABEL_LLMD_JOB):
            store = PodStore(self.view, label)
            source = KubeSource(self._api, "pods", label_selector=label)
            outage = Outage(log, f"watch of pods labelled {label}", "job membership is not updated")
            self._reflectors.append(Reflector(source, store, outage, name=f"pods-{label}"))
            self._watches.append((outage, self.view.listed_once(f"pods {label}")))
        outage = Outage(log, "watch of nodes", "agents' addresses and groups are not updated")
        nodes = Reflector(
            KubeSource(self._api, "nodes"), NodeStore(self.view), outage, name="nodes"
        )
        self._reflectors.append(nodes)
        self._watches.append((outage, self.view.listed_once("nodes")))
        for reflector in self._reflectors:
            reflector.start()

    # Leading (the elector's callbacks run on its thread).

    def _fair_clocks(self) -> dict[str, str]:
        """The fair clocks for the Lease (asked of the event loop; none if it is too busy)."""
        assert self._loop is not None

        async def dump() -> str:
            return fairstate.dump(self.arbiter.table) if self.arbiter.epoch else ""

        try:
            text = asyncio.run_coroutine_threadsafe(dump(), self._loop).result(timeout=1.0)
        except Exception:  # a busy or stopping loop: the Lease keeps the last clocks
            return {}
        return {names.ANNOTATION_FAIR_CLOCKS: text} if text else {}

    def _started_leading(self, epoch: int) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._begin_term, epoch)

    def _stopped_leading(self, reason: str) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._end_term, reason)

    def _begin_term(self, epoch: int) -> None:
        self._term = asyncio.create_task(self._take_over(epoch))

    async def _take_over(self, epoch: int) -> None:
        # A partial view loses turns: wait (bounded) for every watch's first list.
        if not await asyncio.to_thread(self.view.wait_listed, LIST_WAIT_S):
            log.warning(
                "leading with epoch %d before every watch listed once (after %g s): the agent "
                "of each node listed later is asked for its job turns as it appears, and they "
                "are settled then", epoch, LIST_WAIT_S,
            )  # fmt: skip
        table = self._new_table()
        if self._elector is not None:
            inherited = self._elector.inherited.get(names.ANNOTATION_FAIR_CLOCKS, "")
            if fairstate.load(table, inherited):
                log.info("the fair policy's clocks taken up from the Lease")
        found = await recover(self.view, self.links, table, epoch)
        if self._elector is None or self._elector.epoch != epoch or not self._elector.is_leader():
            return  # lost the Lease while recovering
        if found.outranked:
            log.warning(
                "agents obey epoch %d of another leader, not our epoch %d (the Lease was "
                "recreated?): taking the Lease again above it", found.outranked, epoch,
            )  # fmt: skip
            self._elector.outrank(found.outranked)
            return
        self.arbiter.lead(epoch, table, found)
        self._health.serving(True)
        if self._label is not None:
            self._label.want(epoch, self._elector.lease_uid)
        log.info(
            "leading with epoch %d: %d job turn(s) held, %d rolled back%s",
            epoch, len(found.held), len(found.rolled_back),
            f", agents not reached (asked again until they answer): "
            f"{', '.join(sorted(found.unreachable))}" if found.unreachable else "",
        )  # fmt: skip
        outrank = self._elector.outrank  # a node that answers late may obey a newer epoch
        await chase(self.arbiter, found, epoch, self._agents_appeared, outrank)  # ends with term

    def _holds(self, term: Term) -> bool:
        """Whether the Lease, read now, records `term` as this replica's (the label's sweep)."""
        return self._elector is not None and self._elector.holds(term.epoch, term.lease)

    def _end_term(self, reason: str) -> None:
        if self._term is not None:
            self._term.cancel()
        self.arbiter.step_down(reason)
        self._health.serving(False)
        log.warning("no longer leading: %s", reason)
        if self._label is not None:
            self._label.want(0)

    # Stopping.

    async def stop(self) -> None:
        """Step down (releasing the Lease at once), stop serving and watching."""
        if self._elector is not None:
            await asyncio.to_thread(self._elector.stop)
        if self._term is not None:
            self._term.cancel()
        self.arbiter.step_down("the coordinator is stopping")
        if self._server is not None:
            await self._server.stop(0.5)
        if self._label is not None:
            self._label.want(0)
            await asyncio.to_thread(self._label.stop)
        if self._http is not None:
            await self._http.stop()
        await self.arbiter.close()
        await self.links.close()
        for reflector in self._reflectors:
            await asyncio.to_thread(reflector.stop, 5)


class _Health(hp_grpc.HealthServicer):
    """grpc.health.v1: SERVING while this replica leads, NOT_SERVING otherwise; NOT_FOUND for
    a service it does not serve (as the standard says, and as the agent answers)."""

    SERVICES = (
        "",
        jt.DESCRIPTOR.services_by_name["Jobs"].full_name,
        ts.DESCRIPTOR.services_by_name["TimeSliceOrchestratorService"].full_name,
    )

    def __init__(self) -> None:
        self._serving = False

    def serving(self, value: bool) -> None:
        self._serving = value

    async def Check(
        self, request: hp.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> hp.HealthCheckResponse:
        if request.service not in self.SERVICES:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        status = (
            hp.HealthCheckResponse.SERVING if self._serving else hp.HealthCheckResponse.NOT_SERVING
        )
        return hp.HealthCheckResponse(status=status)


async def run_coordinator(config: CoordinatorConfig, early: StopSignal | None = None) -> None:
    """Build and run a coordinator until SIGTERM or SIGINT; then step down and stop cleanly. A
    signal `early` caught before this one's handlers stops it before it starts: it serves and
    campaigns for nothing."""
    from baton.contract.kube import load_api_client

    stop = asyncio.Event()
    why: list[str] = []

    def request_stop(reason: str) -> None:
        why.append(reason)
        stop.set()

    # The client first, under the command's early catch (a second signal interrupts a
    # credential plugin that hangs), then the loop's own handlers.
    coordinator = Coordinator(config, load_api_client(config.kubeconfig))
    on_stop_signal_async(asyncio.get_running_loop(), request_stop)
    if early is not None and early.received:
        request_stop(early.received)
    try:
        if not stop.is_set():
            await coordinator.start()
        await stop.wait()
    finally:
        await coordinator.stop()
    log.info("coordinator stopped on %s", why[0] if why else "cancellation")
