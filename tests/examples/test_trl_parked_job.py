"""A TRL job that another job parked between its turns, on a real agent (`app` backend): what
the watched trainer does on the device outside its steps (`evaluate()`, `save_model()`, and
`train()`'s set-up, which loads a checkpoint it resumes from before `on_train_begin`) takes a
turn, so it runs on memory restored, not on storages a park freed; a step keeps its turn for
its device work, while rewards run off-turn hand it to the other job; and `close()` brings the
parked job back whole before it leaves the agent."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from tests.examples.trl_jobs import Jobs, OtherHolds, on_the_device

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl")


@needs_trl
@pytest.mark.timeout(180)
def test_a_parked_job_evaluates_saves_and_resumes_from_its_checkpoint(jobs: Jobs) -> None:
    jobs.built(2).train()  # writes checkpoint-2
    job = jobs.built(4)
    jobs.parked_by_the_other_job()
    assert "eval_loss" in on_the_device(job.evaluate)
    jobs.parked_by_the_other_job()
    on_the_device(lambda: job.save_model(str(jobs.workdir / "saved")))
    jobs.parked_by_the_other_job()
    on_the_device(lambda: job.train(resume_from_checkpoint=True))  # loads checkpoint-2
    assert job.state.global_step == 4 and not jobs.callback.holding
    assert jobs.callback.parker.stats.restores >= 3


@needs_trl
@pytest.mark.timeout(180)
def test_a_job_closed_while_parked_leaves_the_agent_with_its_model_whole(jobs: Jobs) -> None:
    job = jobs.built(2)
    job.train()
    with jobs.callback.turn():
        trained = {k: v.clone() for k, v in job.model.state_dict().items()}
    jobs.parked_by_the_other_job()

    jobs.callback.close()

    assert not jobs.callback.parker.parked
    assert set(jobs.agent.status()["tenants"]) == {"local/other"}
    kept = job.model.state_dict()
    assert set(kept) == set(trained)
    assert all(kept[k].equal(v) for k, v in trained.items())
    turns = len(jobs.callback.turns)
    assert "eval_loss" in on_the_device(job.evaluate)  # plain calls now: no turn, no error
    on_the_device(lambda: job.save_model(str(jobs.workdir / "saved")))
    assert len(jobs.callback.turns) == turns
    with jobs.other.turn(timeout=30):  # the agent no longer counts the job that left
        pass


@needs_trl
@pytest.mark.timeout(180)
def test_a_job_closed_in_its_turn_leaves_with_its_model_on_the_device(jobs: Jobs) -> None:
    from concurrent.futures import ThreadPoolExecutor

    job = jobs.built(2)
    jobs.callback.begin()
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(jobs.other.acquire, 30)  # needs the job's memory parked or gone
        jobs.callback.close()  # the session ends inside the turn: no park before it leaves
        assert waiting.result(timeout=30).lease_id
        jobs.other.yield_()
    assert not jobs.callback.parker.parked and jobs.callback.parker.stats.parks == 0
    assert "eval_loss" in on_the_device(job.evaluate)


@needs_trl
@pytest.mark.timeout(180)
def test_a_job_closed_as_the_agent_parks_it_leaves_with_its_model_whole(jobs: Jobs) -> None:
    """The other job's acquire has the agent park the job just as it closes (its training
    over, its turn given back): close() waits for that park and brings the models back in a
    last turn, instead of reading them resident as the park begins and leaving them parked."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    parker = jobs.callback.parker
    assert parker is not None
    parking, closing = threading.Event(), threading.Event()

    def park_as_the_job_closes(gpu: str) -> int:
        parking.set()
        assert closing.wait(30), "the job never closed"
        return parker.park(gpu)

    jobs.callback.baton.register_callbacks(on_park=park_as_the_job_closes)
    job = jobs.built(2)
    with jobs.callback.turn():
        trained = {k: v.clone() for k, v in job.model.state_dict().items()}

    def other_turn() -> None:
        with jobs.other.turn(timeout=30):
            pass

    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(other_turn)  # its room: the job's memory, parked by callback
        assert parking.wait(30), "the agent never asked the job to park"
        closing.set()
        jobs.callback.close()
        other.result(timeout=30)

    assert not parker.parked and parker.stats.parks == parker.stats.restores == 1
    assert set(jobs.agent.status()["tenants"]) == {"local/other"}
    kept = job.model.state_dict()
    assert all(kept[k].equal(v) for k, v in trained.items())
    assert "eval_loss" in on_the_device(job.evaluate)


@needs_trl
@pytest.mark.timeout(180)
def test_a_log_from_inside_a_step_keeps_the_steps_turn(jobs: Jobs) -> None:
    """A `compute_loss` that logs an extra figure (`self.log`, as users write it) fires
    `on_log` inside the step, while the other job waits for the GPU: the step keeps its turn
    for its backward and optimizer step, instead of being parked under them."""
    import threading

    job = jobs.built(2)
    loss_of = job.compute_loss
    held: list[bool] = []
    waiting: list[threading.Thread] = []

    def compute_loss(*args: Any, **kwargs: Any) -> Any:
        loss = loss_of(*args, **kwargs)
        if not job.model.training:  # the evaluation's
            return loss
        mark = jobs.agent.mark()
        waiting.append(threading.Thread(target=jobs.parked_by_the_other_job))
        waiting[-1].start()
        jobs.agent.wait_event(lambda e: e.kind == "queued" and "other" in e.tenant_id, 30, mark)
        job.log({"aux_loss": float(loss.detach())})
        held.append(jobs.callback.holding)
        return loss

    job.compute_loss = compute_loss
    try:
        on_the_device(job.train)
    finally:
        for thread in waiting:
            thread.join(timeout=30)
    assert held == [True, True] and job.state.global_step == 2
    assert jobs.callback.parker.stats.parks == 2  # the other job's turns came between steps
    assert [h["aux_loss"] for h in job.state.log_history if "aux_loss" in h]


@needs_trl
@pytest.mark.timeout(180)
def test_async_rewards_run_off_turn_are_awaited_with_the_turn_handed_back_once(
    jobs: Jobs,
) -> None:
    """TRL awaits an async reward (gathering several at once): wrapped with `off_turn` it stays
    one, runs with the turn handed back (the other job takes its turn meanwhile), and the
    turn comes back once the last of them ends, instead of TRL calling a plain wrapper and
    failing on the coroutine it returned ('coroutine' object is not iterable)."""
    import asyncio

    from agent.examples.trl_train.jobs import reverse_reward

    held: list[bool] = []
    score = reverse_reward()

    async def brevity(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        held.append(jobs.callback.holding)
        await asyncio.sleep(0)  # ends first, while verify still runs
        return [-len(c) / 10 for c in completions]

    async def verify(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        held.append(jobs.callback.holding)
        await asyncio.to_thread(jobs.parked_by_the_other_job)  # the GPU is the other's now
        held.append(jobs.callback.holding)  # still off-turn though brevity ended
        return score(prompts, completions)

    job = jobs.grpo([jobs.callback.off_turn(brevity), jobs.callback.off_turn(verify)])
    on_the_device(job.train)
    assert job.state.global_step == 2 and held == [False] * 6
    parker = jobs.callback.parker
    assert parker is not None and parker.stats.parks == parker.stats.restores == 2
    assert len(jobs.callback.turns) == 1 + 2 * 2  # the build's; two a step, one around both
    assert "rewards/verify/mean" in job.state.log_history[0]


@needs_trl
@pytest.mark.timeout(180)
def test_ctrl_c_in_a_reward_run_off_turn_stops_without_waiting_for_the_gpu(jobs: Jobs) -> None:
    """A KeyboardInterrupt raised in a reward run off-turn while the other job holds the GPU
    leaves `train()` at once, holding no turn, instead of waiting for the other job's turn to
    end (up to the agent's --max-hold) to take one only to give it back; the save made on the
    interrupt, as users write it, takes its turn then."""
    other = OtherHolds(jobs)

    def interrupted(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        other.start()
        raise KeyboardInterrupt

    job = jobs.grpo([jobs.callback.off_turn(interrupted)])
    try:
        with pytest.raises(KeyboardInterrupt):
            job.train()
        assert not other.held_to_the_end.is_set()  # train() left while the other job held on
        assert not jobs.callback.holding
    finally:
        other.release()
    on_the_device(lambda: job.save_model(str(jobs.workdir / "interrupted")))
    assert jobs.callback.parker.stats.restores == 1


@needs_trl
@pytest.mark.timeout(60)
def test_ctrl_c_as_a_turn_is_granted_gives_the_turn_back(jobs: Jobs, sigint_raises: None) -> None:
    """A Ctrl-C that lands as the agent's grant returns, before the callback records the turn,
    gives the turn back: the other job gets the GPU at once, instead of the turn staying held,
    by nobody, until the agent's --max-hold (60 s) preempts it."""
    import _thread

    baton = jobs.callback.baton
    acquire = baton.acquire

    def granted_then_interrupted(timeout: float | None = None) -> Any:
        lease = acquire(timeout)
        _thread.interrupt_main()  # as a SIGINT arriving with the grant
        return lease

    baton.acquire = granted_then_interrupted
    with pytest.raises(KeyboardInterrupt):
        jobs.callback.begin()
    baton.acquire = acquire
    assert not jobs.callback.holding and baton.lease is None
    with jobs.other.turn(timeout=10):  # the agent granted the job nothing it still holds
        pass
    jobs.callback.begin()  # and the job's next turn is an ordinary one
    assert jobs.callback.holding
    jobs.callback.end()


@needs_trl
@pytest.mark.timeout(60)
def test_ctrl_c_in_begin_leaves_a_turn_the_user_held_before_it(
    jobs: Jobs, sigint_raises: None
) -> None:
    """A turn the user took with the callback's client before `begin()` (acquire returns it as
    held) is the user's: an interrupt inside `begin()` leaves it held, not given back."""
    import _thread

    baton = jobs.callback.baton
    acquire = baton.acquire
    mine = baton.acquire(10)

    def held_then_interrupted(timeout: float | None = None) -> Any:
        lease = acquire(timeout)
        _thread.interrupt_main()
        return lease

    baton.acquire = held_then_interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            jobs.callback.begin()
    finally:
        baton.acquire = acquire
    assert not jobs.callback.holding
    assert baton.lease is not None and baton.lease.lease_id == mine.lease_id
    baton.yield_()


@needs_trl
@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["before the yield", "as the device work ends"])
def test_ctrl_c_in_end_gives_the_turn_back(jobs: Jobs, where: str) -> None:
    """A Ctrl-C that lands in `end()` after the turn is marked no longer held, before its
    yield leaves (as the yield begins, or as the parker's hold ends), gives the turn back all
    the same: the other job gets the GPU at once, instead of the turn staying held, by a
    callback that believes it holds none, until the agent's --max-hold (60 s) preempts it."""
    callback = jobs.callback
    baton, parker = callback.baton, callback.parker
    assert parker is not None
    yield_, in_use = baton.yield_, parker.in_use

    def interrupted_yield() -> None:
        baton.yield_ = yield_  # once: the yield made after it is the real one
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def interrupted_as_it_ends() -> Iterator[None]:
        with in_use():
            yield
        raise KeyboardInterrupt

    if where == "before the yield":
        baton.yield_ = interrupted_yield
    else:
        parker.in_use = interrupted_as_it_ends
    try:
        callback.begin()
        with pytest.raises(KeyboardInterrupt):
            callback.end()
    finally:
        baton.yield_, parker.in_use = yield_, in_use
    assert not callback.holding and baton.lease is None
    with jobs.other.turn(timeout=10):  # the agent holds no turn of the job's for it
        pass
    callback.begin()  # and the job's next turn is an ordinary one
    assert callback.holding
    callback.end()
