"""A TRL tenant process: `SFTTrainer` or `GRPOTrainer` taking Baton turns through `BatonCallback`.

    python -m agent.examples.trl_train.tenant --kind grpo --name t1 --steps 8 --go

It speaks the protocol of `agent.examples.train.tenant` (a "ready" line, `go <deadline>` on
stdin, one "done" line with every step's loss and reward, its turns, its moves and its final
parameters' SHA-256), so `commands.demo.train` runs it alone or sharing a GPU. The trainer is built
and the final model saved inside turns; `--solo` trains without an agent, the same code path.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from agent.examples.train.tenant import Report, say
from agent.examples.trl_train.jobs import KINDS, TrlConfig
from baton.contract.names import MIB


class SoloBaton:
    """Stands in for `Baton` with no agent: every acquire is granted at once."""

    lease = None
    """No turn to give back: the agent's turns are `Baton`'s."""

    def __init__(self) -> None:
        self.count = 0
        self.tenant = None

    def register_callbacks(self, *_: Any) -> None:
        pass

    def acquire(self, timeout: float | None = None) -> Any:
        self.count += 1
        return argparse.Namespace(lease_id=f"solo-{self.count}")

    def yield_(self) -> None:
        pass

    def close(self) -> None:
        pass

    def close_unless(self, keep: Any) -> bool:
        """`close()`: with no agent nothing is ever parked, so no last turn is kept open."""
        self.close()
        return False


def checked_callback(baton: Any, report: Report, acquire_timeout: float) -> Any:
    """A `BatonCallback` that checks, at the start of each turn, that the model's parameters are
    what the last turn left (a park and restore in between must not change them)."""
    from agent.client.trl import BatonCallback

    class Checked(BatonCallback):
        ok = True
        last: float | None = None
        model: Any = None

        def watch(self, *sources: Any) -> None:
            super().watch(*sources)
            if self.model is None:  # the first source: the trainer, whose model trains
                self.model = getattr(sources[0], "model", sources[0])

        def begin(self) -> None:
            fresh = not self.holding
            super().begin()
            check = fresh and self.model is not None and self.last is not None
            if check and fingerprint(self.model) != self.last:
                self.ok = False
                report.mismatches.append(f"turn {len(self.turns)}: parameters changed")

        def end(self) -> None:
            if self.holding and self.model is not None:
                self.last = fingerprint(self.model)
            super().end()

    return Checked(baton, acquire_timeout=acquire_timeout)


def fingerprint(model: Any) -> float:
    """A cheap summary of the parameters, to check they survived a park."""
    return float(sum(p.detach().double().sum().item() for p in model.parameters()))


def recorder(report: Report, checked: Any) -> Any:
    """A callback that records each step's end, loss and reward from the trainer's logs, and
    counts the steps whose turns all found the parameters as the last turn left them."""
    from transformers import TrainerCallback

    class Recorder(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if report.steps > 0 and checked.ok:
                report.verified += 1
            checked.ok = True
            report.steps += 1
            report.step_ends.append(time.time())

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs and "train_loss" not in logs:
                report.losses.append(float(logs["loss"]))
                if "reward" in logs:
                    report.rewards.append(float(logs["reward"]))

    return Recorder()


def deadline_stop(deadline: float) -> Any:
    """A callback that ends training at the first step end past `deadline` (the demo's runs)."""
    from transformers import TrainerCallback

    class Deadline(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if time.time() >= deadline:
                control.should_training_stop = True

    return Deadline()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="A TRL SFT or GRPO tenant taking Baton turns.")
    p.add_argument("--name", default=os.environ.get("HOSTNAME", "trl"))
    p.add_argument("--steps", type=int, default=8)
    for f in fields(TrlConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "kind":
            p.add_argument(flag, choices=KINDS, default=f.default)
        else:
            p.add_argument(flag, type=type(f.default), default=f.default)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--duty", type=int, default=0, help="gpu-duty to declare, percent")
    p.add_argument("--solo", action="store_true", help="train without an agent")
    p.add_argument("--go", action="store_true", help="start without waiting for 'go'")
    p.add_argument("--acquire-timeout", type=float, default=120.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point of one tenant process."""
    args = parse_args(argv)
    from agent.examples.trl_train.jobs import deterministic, digest, trainer

    deterministic(args.threads)
    from agent.client import Baton

    config = TrlConfig(**{f.name: getattr(args, f.name) for f in fields(TrlConfig)})
    mib = math.ceil(config.footprint_bytes() / MIB)
    baton: Any = (
        SoloBaton() if args.solo else Baton(name=args.name, gpu_memory_mib=mib, gpu_duty=args.duty)
    )
    report = Report()
    callback = checked_callback(baton, report, args.acquire_timeout)
    workdir = Path(tempfile.mkdtemp(prefix="baton-trl-"))
    try:
        tenant_id = args.name
        if not args.solo:
            baton.connect()
            tenant_id = baton.tenant.tenant_id
        with callback.turn():  # the trainer places the model on the device: inside a turn
            job = trainer(
                config,
                args.steps,
                workdir,
                [callback, recorder(report, callback)],
                callback.off_turn,
            )
            callback.watch(job)
        build_turns = len(callback.turns)
        say(event="ready", tenant_id=tenant_id, pid=os.getpid())
        command = ["go", "inf"] if args.go else sys.stdin.readline().split()
        if command[:1] != ["go"] or len(command) != 2:
            say(event="error", error=f"expected 'go <deadline>', got {command!r}")
            return 1
        job.add_callback(deadline_stop(float(command[1])))
        report.started = time.time()
        job.train()
        report.ended = time.time()
        with callback.turn():  # the final read and save touch the device
            report.params_sha256 = digest(job.model)
            job.save_model(str(workdir / "final"))
            assert callback.parker is not None
            report.footprint_bytes = callback.parker.footprint_bytes()
        report.turns = callback.turns[build_turns:-1]
        report.moves = asdict(callback.parker.stats)
        report.callbacks = [list(t) for t in getattr(baton, "callback_timings", [])]
        say(event="done", tenant_id=tenant_id, name=args.name, kind=args.kind, **asdict(report))
        if not args.go:  # stay connected until every tenant of the run is done
            sys.stdin.readline()
        return 0
    except Exception as e:
        say(event="error", error=f"{type(e).__name__}: {e}")
        return 1
    finally:
        try:
            callback.close()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
