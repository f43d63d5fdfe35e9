"""A TRL job across a restart of its node agent (a DaemonSet rollout): the turns `BatonCallback`
takes inside `trainer.train()` are asked for again once the client reconnects, as a tenant
should (docs/client.md, Sessions); the trainer cannot retry them itself."""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.examples.test_trl_callback import Recorder

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl")


@needs_trl
@pytest.mark.timeout(90)
def test_a_job_waiting_for_its_turn_as_the_agent_restarts_gets_it_after(workdir: str) -> None:
    import torch

    from agent.client import Baton
    from agent.client.torch import TorchParker
    from agent.client.trl import BatonCallback
    from agent.parking.setup import ParkingOptions
    from baton.contract.names import fake_gpu_uuid
    from tests.harness.agent import AgentRunner

    parking = ParkingOptions(backend="app", fake_gpus="1x100", simulated_inventory=True)
    gpu = fake_gpu_uuid(0)
    agent = AgentRunner(workdir, parking=parking).start()
    callback = BatonCallback(Baton(agent.socket, [gpu], name="job", gpu_memory_mib=60))
    weights = TorchParker(torch.zeros(1024))  # the other job's, parked for the job's turn
    other = Baton(
        agent.socket, [gpu], name="other", gpu_memory_mib=60,
        on_park=weights.park, on_restore=weights.restore,
    )  # fmt: skip
    try:
        other.acquire(30)
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(callback.begin)  # a step's turn, asked inside train()
            agent.wait_event(lambda e: e.kind == "queued" and e.tenant_id.endswith("job"), 30)
            agent.stop()
            agent = AgentRunner(workdir, parking=parking).start()
            other.yield_()  # the holder kept its turn across the restart; it ends it
            waiting.result(timeout=60)
        assert callback.holding
        callback.end()
        assert not callback.holding
    finally:
        callback.close()
        other.close()
        agent.stop()


class YieldLostOnce(Recorder):
    """Stands in for `Baton`: its first yield is lost to an agent restart."""

    opened = True

    def yield_(self) -> None:
        from agent.client.errors import AgentUnavailable

        if "yield lost" not in self.events:
            self.events.append("yield lost")
            raise AgentUnavailable("lost the Baton agent; reconnecting, retry the call")
        self.events.append("yield")


@needs_trl
def test_a_yield_lost_to_an_agent_restart_is_made_again() -> None:
    from agent.client.trl import BatonCallback

    baton = YieldLostOnce()
    callback = BatonCallback(baton, park=False)  # type: ignore[arg-type]
    callback.begin()
    callback.end()  # at a step's end, inside train(): raising would end the training
    assert baton.events == ["acquire", "yield lost", "yield"] and not callback.holding


@needs_trl
def test_an_agent_never_reached_fails_the_first_turn_at_once(workdir: str) -> None:
    import time

    from agent.client import AgentUnavailable, Baton
    from agent.client.trl import BatonCallback

    callback = BatonCallback(Baton(f"{workdir}/absent.sock", ["GPU-0"], name="job"))
    began = time.monotonic()
    with pytest.raises(AgentUnavailable, match="is `baton agent` running"):
        callback.begin()
    assert time.monotonic() - began < 5
    callback.close()
