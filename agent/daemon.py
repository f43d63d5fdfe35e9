"""A built node agent's life: `Agent.start` opens its sockets and servers, `stop` closes them.

`start` reinstates the saved state, then serves gRPC on the socket, the handshake of direct
sessions, llm-d's API, the coordinator's job turns, the pod watch and HTTP status and metrics,
in that order; what cannot open raises `AgentStartError`, naming the option to pass. Tenants,
leases and parked memory outlive `stop`. `agent.assembly.build_agent` makes the `Agent`.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import socket
from pathlib import Path
from typing import Any

import grpc

from agent.config import AgentConfig, AgentStartError
from agent.core.residency import TurnPreparer
from agent.node.identity import (
    HandshakeServer,
    TokenRegistry,
    container_id_of_pid,
    pod_uid_of_pid,
    serve_handshake,
)
from agent.node.podwatch import PodWatcher
from agent.parking.host import Parking
from agent.parking.methods import NONE
from agent.server import direct_session, turn_state
from agent.server.coordination import Coordination
from agent.server.grpc_server import AgentServicer
from agent.server.llmd.groups import Groups
from agent.server.llmd.server import LlmdServer
from agent.server.readiness import Readiness, SocketUnusable, claim_sockets
from agent.server.service import LeaseService
from agent.server.sessions import SessionRegistry
from agent.server.status import status_json
from agent.wire.handshake import handshake_path
from baton._pb import agent_pb2_grpc
from baton.contract.statushttp import StatusServer
from baton.contract.tcpbind import bind_error
from baton.contract.unixsocket import ServedSocket, unix_target

SESSIONS_CLOSE_S = 1.0
"""How long a stop waits, once the gRPC server has stopped, for the sessions it cut to close."""

log = logging.getLogger("agent.assembly")  # the start and stop lines share run_agent's logger


class Agent:
    """A node agent built by `build_agent`: `start`, then `stop`."""

    def __init__(
        self,
        config: AgentConfig,
        service: LeaseService,
        tokens: TokenRegistry,
        watch_token: str,
        api_client: Any,
    ) -> None:
        self.config = config
        self.service = service
        self._tokens = tokens
        self._watch_token = watch_token
        self._api_client = api_client
        self.http_port = 0
        self._grpc: grpc.aio.Server | None = None
        self._servicer: AgentServicer | None = None
        self._socket = ServedSocket(config.socket)
        self._handshake: HandshakeServer | None = None
        self._http: StatusServer | None = None
        self._pods: PodWatcher | None = None
        self.llmd: LlmdServer | None = None
        self.coordination: Coordination | None = None
        self._stop_requested = asyncio.Event()
        self.readiness = Readiness(config.node_name)
        self.readiness.unrecorded = self.service.state.unrecorded

    @property
    def preparer(self) -> TurnPreparer:
        """The residency layer (a `NullPreparer` with `--backend none`)."""
        return self.service.preparer

    @property
    def parking(self) -> Parking | None:
        """The parking preparer, if the agent parks memory."""
        return self.service.parking

    @property
    def sessions(self) -> SessionRegistry:
        return self.service.sessions

    async def start(self) -> None:
        """Reinstate the saved state, open the sockets (none where a stop was already asked);
        raises `AgentStartError` (what to pass) before anything is served."""
        cfg = self.config
        service = self.service
        service.load()
        if self._stop_requested.is_set():
            return  # told to stop before it served: it serves nothing, and `stop` saves the state
        if service.parking is not None:
            try:  # what the agent before this one left parked shows in /v1/status and /metrics
                await service.parking.refresh()
            except Exception as exc:  # read again when a turn needs it
                log.warning("reading the tenants' memory at start failed: %s", exc)
        service.account()  # memory parked before the restart is charged from the start on
        service.metrics.watch(
            service.table,
            lambda: len(service.sessions.tenants()),
            service.state.clock,
            service.tenants.per_gpu,
            service.parking.gpu_memory if service.parking is not None else (),
        )
        self._prepare_socket_dir()
        self._grpc = grpc.aio.server()
        local_tenants = cfg.allow_local_tenants or not cfg.node_name
        servicer = self._servicer = AgentServicer(
            service,
            self._tokens,
            self._watch_token,
            local_tenants,
            self._container_id_of,
        )
        agent_pb2_grpc.add_AgentServicer_to_server(servicer, self._grpc)
        self._listen_grpc(unix_target(cfg.socket), "--socket (BATON_AGENT_SOCKET)", self._socket)
        if cfg.debug_tcp_port:
            self._listen_grpc(f"127.0.0.1:{cfg.debug_tcp_port}", "--debug-tcp-port")
        await self._grpc.start()
        self._socket.publish(cfg.socket_mode)  # bound privately: see ServedSocket
        self._handshake = await serve_handshake(
            handshake_path(cfg.socket),
            self._tokens,
            cfg.socket_mode,
            functools.partial(direct_session.serve, servicer),
            self._pod_uid_of,
        )
        self.readiness.listening(cfg.socket, handshake_path(cfg.socket))

        if cfg.llmd_listen:
            await self._start_llmd(service)
        if cfg.coordinator and not cfg.coordination_listen:
            raise AgentStartError(
                "--coordinator needs --coordination-listen: the coordinator grants a job's turn "
                "through this agent's job turns"
            )
        if cfg.coordination_listen:
            await self._start_job_turns(service)
        if self._api_client is not None:
            self._start_pod_watch(service, self._api_client)
        self._http = StatusServer(
            service.metrics.registry,
            lambda: status_json(service, service.state.clock()),
            self.readiness.not_ready,
        )
        try:
            self.http_port = await self._http.start(cfg.http_host, cfg.http_port)
        except OSError as exc:  # the port taken or forbidden, else the host is not this node's
            flag = "port" if exc.errno in (errno.EADDRINUSE, errno.EACCES) else "host"
            raise AgentStartError(
                f"cannot serve status and metrics on {cfg.http_host}:{cfg.http_port} "
                f"({exc.strerror}); pass another --http-{flag} (BATON_AGENT_HTTP_{flag.upper()})"
            ) from None
        log.info(
            "agent ready: socket %s, http :%d, policy %s, max hold %g s, state %s, "
            "socket mode %04o, local tenants %s",
            cfg.socket, self.http_port, cfg.queue_policy, cfg.max_hold, cfg.state_dir,
            cfg.socket_mode, "allowed" if local_tenants else "refused (serving pods)",
        )  # fmt: skip

    async def _start_llmd(self, service: LeaseService) -> None:
        cfg = self.config
        parking = self.parking
        self.llmd = LlmdServer(
            service,
            cfg.llmd_listen,
            Groups.from_specs(cfg.llmd_groups),
            parking.gpu_memory if parking is not None else {},
            cfg.node_name or socket.gethostname(),
            ",".join(parking.methods()) if parking is not None else NONE,
            Path(cfg.proc_root),
            cfg.llmd_forget_idle_after,
        )
        await self.llmd.start()

    async def _start_job_turns(self, service: LeaseService) -> None:
        cfg = self.config
        node = cfg.node_name or socket.gethostname()
        self.coordination = Coordination(
            service,
            node,
            cfg.state_dir,
            cfg.coordination_listen,
            cfg.coordination_token,
            cfg.coordinator,
        )
        try:
            await self.coordination.start(
                self._api_client, cfg.node_name, cfg.coordination_advertise
            )
        except (ValueError, RuntimeError) as exc:
            raise AgentStartError(f"{exc}; check --coordination-listen and its token") from None

    def _pod_uid_of(self, pid: int) -> str | None:
        return pod_uid_of_pid(pid, Path(self.config.proc_root))

    def _container_id_of(self, pid: int) -> str | None:
        return container_id_of_pid(pid, Path(self.config.proc_root))

    def _prepare_socket_dir(self) -> None:
        """The socket's directory exists and holds no stale socket, nor one another serves."""
        path = self.config.socket
        try:
            claim_sockets(path, handshake_path(path))
        except SocketUnusable as exc:
            raise AgentStartError(str(exc)) from None
        except OSError as exc:
            raise AgentStartError(
                f"cannot create the socket {path} ({exc.strerror}: {exc.filename}); "
                "pass --socket (BATON_AGENT_SOCKET) in a writable directory"
            ) from None

    def _listen_grpc(self, address: str, option: str, served: ServedSocket | None = None) -> None:
        assert self._grpc is not None
        try:
            bound = self._grpc.add_insecure_port(served.address if served else address)
            if not bound and not address.startswith("unix:"):  # gRPC's no, for a TCP port
                raise RuntimeError(address)
        except RuntimeError:
            why = served.bind_error() if served else bind_error(address)
            raise AgentStartError(f"cannot listen on {address} ({why}); check {option}") from None

    def _start_pod_watch(self, service: LeaseService, api_client: Any) -> None:
        self._pods = pods = PodWatcher(
            api_client,
            self.config.node_name,
            asyncio.get_running_loop(),
            service.upsert_pod,
            service.pod_gone,
            {t.pod_uid: t.tenant_id for t in service.tenants.tenants.values() if t.pod_uid},
        )
        self._pods.start()
        self.readiness.pods_listed = lambda: pods.listed

    def _say_moves_under_way(self) -> None:
        """Name the tenants whose memory a move still moves once the state is saved: a move in
        a worker thread cannot be cut short, and the stop waits only `CLOSE_WAIT_S` for it."""
        parking = self.parking
        tenants = self.service.tenants.tenants
        moving = sorted(t for t in tenants if parking is not None and parking.moving(t))
        if moving:
            log.warning(
                "stopping with the memory of %s still moving after %g s of waiting (a move "
                "cannot be cut short): the state saved may not have where it ends, which the next "
                "agent reads from the backend; this process exits once the move has ended",
                ", ".join(moving), turn_state.CLOSE_WAIT_S,
            )  # fmt: skip

    def request_stop(self, reason: str) -> None:
        """Wake `wait`: the agent should stop, for `reason` (e.g. `SIGTERM`)."""
        self.readiness.stop(reason)
        self._stop_requested.set()

    async def wait(self) -> None:
        """Block until a stop is requested (or `stop` is called)."""
        await self._stop_requested.wait()

    async def stop(self) -> None:
        """Refuse new RPCs, let in-flight ones finish within the grace, flush state, close;
        tenants, leases and parked memory stay for the next agent (`/readyz` answers 503)."""
        self.service.stopping = True
        self.readiness.stop("")
        if self._pods is not None:
            await asyncio.to_thread(self._pods.stop)  # waits for its thread
        if self._handshake is not None:
            self._handshake.close()
        if self.llmd is not None:
            await self.llmd.stop(self.config.shutdown_grace)
        if self.coordination is not None:
            await self.coordination.stop(self.config.shutdown_grace)
        if self._servicer is not None:
            on = f" on {self.readiness.stopping}" if self.readiness.stopping else ""
            why = f"the agent is stopping{on}; watch again once it is back"
            self._servicer.end_watches(why, self.config.shutdown_grace)
        if self._grpc is not None:
            await self._grpc.stop(grace=self.config.shutdown_grace)
        if self._servicer is not None:  # the gRPC sessions the stop cut are closing: let them
            await self._servicer.sessions_closed(SESSIONS_CLOSE_S)
        if self._http is not None:
            await self._http.stop()
        await self.service.close()
        self._say_moves_under_way()
        self._socket.remove()  # only while its own: not a live agent's, nor a newer one's
        self.readiness.remove_own_sockets()
        self._stop_requested.set()
