"""The RL trainer beside batch inference on a real agent (fair policy, fake backend): the
trainer waits at most one batch turn plus the grace (plus a handover), the batch tenant is never
starved and keeps its minimum share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.core.fair import FairConfig
from agent.core.waitbound import HANDOVER_S
from agent.examples.trainer_batch import BATCH, TRAINER, run
from agent.parking.setup import ParkingOptions
from baton.contract.names import ENV_AGENT_SOCKET, ENV_GPUS, fake_gpu_uuid
from tests.harness.agent import AgentRunner, short_tmpdir

ROOT = Path(__file__).resolve().parents[2]
GRACE_S = 0.1
MIN_SHARE = 0.1
SECONDS = 4.0
pytestmark = pytest.mark.timeout(60)


def test_the_trainer_goes_first_and_the_batch_tenant_keeps_its_share() -> None:
    workdir = short_tmpdir()
    parking = ParkingOptions(backend="fake", fake_gpus="1x100", fake_dir=f"{workdir}/gpus")
    fair = FairConfig(min_share=MIN_SHARE, tier_grace_s=GRACE_S)
    with AgentRunner(workdir, queue_policy="fair", fair=fair, parking=parking) as agent:
        figures = run(agent.config.socket, [fake_gpu_uuid(0)], seconds=SECONDS)
        held = {t: s for _, t, s in agent.status()["accounting"]["gpu_seconds_by_gpu"]}
        revoked = [e for e in agent.seen if e.kind == "revoked"]
    trainer, batch = figures["trainer"], figures["batch"]
    bound = BATCH.turn_s + GRACE_S + HANDOVER_S
    assert trainer["turns"] >= 5 and trainer["max_wait_s"] <= bound, trainer
    assert batch["turns"] >= 2, "the batch tenant is never starved"
    assert held["local/batch"] / SECONDS >= MIN_SHARE, held
    assert held["local/trainer"] > held["local/batch"], (TRAINER, held)
    assert all(e.tenant_id == "local/batch" for e in revoked), "only the lower tier is revoked"


def test_the_example_runs_as_a_program_against_an_agent() -> None:
    with AgentRunner(queue_policy="fair", fair=FairConfig(tier_grace_s=GRACE_S)) as agent:
        env = {**os.environ, ENV_AGENT_SOCKET: agent.config.socket, ENV_GPUS: "GPU-0"}
        done = subprocess.run(
            [sys.executable, "-m", "agent.examples.trainer_batch", "--seconds", "1"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["trainer"]["turns"] >= 1 and summary["batch"]["priority"] == 0
