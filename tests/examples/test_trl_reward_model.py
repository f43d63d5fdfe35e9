"""A TRL GRPO job that scores with a reward model, on a real agent (`app` backend) with another
job that parks it between turns: the watched trainer parks the reward model with the policy."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl")


@needs_trl
@pytest.mark.timeout(120)
def test_a_reward_model_is_parked_with_the_policy_and_scores_after_its_restore(
    tmp_path: Path, workdir: str
) -> None:
    import torch
    from transformers import Qwen2ForSequenceClassification
    from trl import GRPOConfig, GRPOTrainer

    from agent.client import Baton
    from agent.client.torch import TorchParker
    from agent.client.trl import BatonCallback
    from agent.examples.trl_train import jobs
    from agent.parking.setup import ParkingOptions
    from baton.contract.names import fake_gpu_uuid
    from tests.harness.agent import AgentRunner

    jobs.deterministic()
    # One simulated 100 MiB GPU: two jobs of 60 MiB cannot both be resident.
    parking = ParkingOptions(backend="app", fake_gpus="1x100", simulated_inventory=True)
    with AgentRunner(workdir, parking=parking) as agent:
        gpu = fake_gpu_uuid(0)
        callback = BatonCallback(Baton(agent.socket, [gpu], name="job", gpu_memory_mib=60))
        weights = TorchParker(torch.zeros(1024))
        other = Baton(
            agent.socket, [gpu], name="other", gpu_memory_mib=60,
            on_park=weights.park, on_restore=weights.restore,
        )  # fmt: skip
        try:
            config = jobs.TrlConfig(kind="grpo", seed=7, batch=4, group=4, beta=0.0)
            scoring = jobs.model_config(config)
            scoring.num_labels = 1
            scorer = Qwen2ForSequenceClassification(scoring)  # a reward model of the policy's size
            args = GRPOConfig(
                output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=4,
                num_generations=4, max_completion_length=5, beta=0.0, use_cpu=True,
                report_to="none", save_strategy="no", disable_tqdm=True,
            )  # fmt: skip
            with callback.turn():
                job = GRPOTrainer(
                    model=jobs.model(config, tmp_path), reward_funcs=[scorer], args=args,
                    train_dataset=jobs.dataset(config, 16), processing_class=jobs.tokenizer(),
                    reward_processing_classes=[jobs.tokenizer()], callbacks=[callback],
                )  # fmt: skip
                callback.watch(job)
            with other.turn(timeout=30):
                assert callback.parker is not None and callback.parker.parked
                assert "parked by Baton" in repr(scorer.score.weight)  # its bytes left too
            job.train()  # restored: the reward model scores every step
            assert job.state.global_step == 2 and not callback.holding
        finally:
            callback.close()
            other.close()
