"""The agent's part in a job's cluster-wide turn, started and stopped as one: its job turns
served to the coordinator (`agent.server.jobturns_link`), its address on its node's annotation
(`agent.node.coordination`), and, with a coordinator address, member pods' own acquires
forwarded there (`agent.server.coordinated`)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agent.node.coordination import CoordinationAddress
from agent.node.jobturn_store import JobTurnStore
from agent.server.coordinated import CoordinatedTurns
from agent.server.jobturns import JobTurns
from agent.server.jobturns_link import JobTurnServer
from agent.server.service import LeaseService


class Coordination:
    """`start` (RuntimeError or ValueError naming what is wrong), then `stop`."""

    def __init__(
        self,
        service: LeaseService,
        node: str,
        state_dir: str | Path,
        listen: str,
        token: str,
        coordinator: str = "",
    ) -> None:
        self.turns = JobTurns(service, node, JobTurnStore(state_dir), service.state.clock)
        self._service = service
        self._listen = listen
        self._token = token
        self._coordinator = coordinator
        self.server: JobTurnServer | None = None
        self._jobs: CoordinatedTurns | None = None
        self._address: CoordinationAddress | None = None
        self.port = 0

    async def start(self, api_client: Any, node_name: str, advertise: str) -> int:
        """Take up the saved turns, serve them; with `api_client`, advertise on the node."""
        self.turns.load()
        if self._coordinator:
            self._jobs = CoordinatedTurns(self.turns, self._coordinator, self._token)
            self._service.jobs = self._jobs
            self._jobs.start()
        self.server = JobTurnServer(self.turns, self._listen, self._token)
        self.port = await self.server.start()
        if api_client is not None:
            address = advertise or f"{self._listen.rpartition(':')[0]}:{self.port}"
            self._address = CoordinationAddress(api_client, node_name, address)
            self._address.start()
        return self.port

    async def stop(self, grace: float) -> None:
        """Stop serving and advertising; the turns stay on disk for the next agent."""
        if self._address is not None:
            await asyncio.to_thread(self._address.stop)
        if self.server is not None:
            await self.server.stop(grace)
        self.turns.close()
        if self._jobs is not None:
            await self._jobs.close()
