"""Agents serving llm-d's API for the tests of this package."""

from __future__ import annotations

from typing import Any

from agent.parking.setup import ParkingOptions, parse_fake_gpus
from tests.harness.agent import AgentRunner


def one_group_agent(workdir: str, backend: str, **options: Any) -> AgentRunner:
    """A started agent parking by `backend` on one simulated GPU of 1024 MiB, the llm-d group
    `g`, serving llm-d's API on a free loopback port (`options`: AgentRunner's others)."""
    gpu = sorted(parse_fake_gpus("1x1024"))[0]
    return AgentRunner(
        workdir,
        parking=ParkingOptions(backend=backend, fake_gpus="1x1024"),
        llmd_listen="127.0.0.1:0",
        llmd_groups=(f"g={gpu}",),
        **options,
    ).start()
