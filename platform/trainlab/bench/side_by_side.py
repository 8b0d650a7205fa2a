"""What the benches that race trainlab's Trainer against another loop in one process share: the
Trainer's timed round (`engine_loop`), one round's measurement (`Loop`), and stopping on
SIGTERM or Ctrl-C with exit 128 + signal and no ratio (`run_stoppable`)."""

from __future__ import annotations

import os
import resource
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from trainlab import names
from trainlab.console import print0
from trainlab.engine.run import build_trainer
from trainlab.plan.trial_plan import Where, plan_trial
from trainlab.vocab.tracker import JsonlTracker


class Stopped(Exception):
    """The bench was asked to stop: SIGTERM reached its handler, or the trainer's (which
    ends the engine's round after the step, status preempted)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum, _frame) -> None:
    raise Stopped(signum)


def end_children() -> None:
    """Kill what this process started and still runs (a writer whose metrics a stopped bench
    does not need: its store is a temporary directory)."""
    import psutil

    children = psutil.Process().children()
    for child in children:
        child.kill()
    psutil.wait_procs(children, timeout=10)


def run_stoppable(label: str, bench: Callable[[], None]) -> None:
    """Run `bench`; SIGTERM (which the trainer takes over while it trains) or Ctrl-C ends it,
    whichever loop is running, with `label: stopped by SIG...; no ratio` and exit 128 + signal."""
    signal.signal(signal.SIGTERM, _stop)
    try:
        bench()
    except (Stopped, KeyboardInterrupt) as e:
        signum = e.signum if isinstance(e, Stopped) else signal.SIGINT
        end_children()
        print0(f"{label}: stopped by {signal.Signals(signum).name}; no ratio")
        sys.exit(128 + signum)


def children_cpu_s() -> float:
    """CPU seconds of this process's children that have ended (the writer, once closed)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Loop:
    """One loop's measurement."""

    tokens_per_s: float
    cpu_s: float
    """CPU seconds of this process (all its threads) from the first step to the end."""
    writer_cpu_s: float = 0.0
    """The engine's MLflow writer process, its whole life."""
    close_s: float = 0.0
    """Seconds the engine waited for the writer's last delivery after training (in its time)."""
    losses: list[float] = field(default_factory=list)
    """Every optimizer step's train loss (mean over the global batch), in step order."""


def engine_loop(run, dist_info, *, tracking_dir: str) -> Loop:
    """The Trainer with every telemetry hook on and its tracker: MLflow (a store in
    `tracking_dir`, system metrics as configured) or, with tracking=none, the JSONL file
    there (where MLflow is not installed, as on the GPU machines). Timed from the first step
    to the tracker's last delivery."""
    writer_cpu = children_cpu_s()
    tracker = None
    if dist_info.is_rank0 and run.tracking.name == "mlflow":
        from trainlab.tracking.continued_run import start_trial_tracking

        tracker = start_trial_tracking(run, tracking_uri=f"sqlite:///{tracking_dir}/bench.db")[1]
    elif dist_info.is_rank0:
        tracker = JsonlTracker(os.path.join(tracking_dir, "metrics.jsonl"))
    trainer = build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info, tracker=tracker)
    trainer.add_hook(lambda tr, step, metrics: None, every=1)  # a progress consumer, as in a real run
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = trainer.train()
    if result.status == names.STATUS_PREEMPTED:  # the trainer took the stop signal: stop here too
        raise Stopped(trainer.preemption.signum or signal.SIGTERM)
    t_close = time.perf_counter()
    if tracker is not None:
        tracker.close()  # the final flush is part of the engine's cost
    t_end = time.perf_counter()
    return Loop(result.tokens_seen / (t_end - t0), time.process_time() - cpu0,
                writer_cpu_s=children_cpu_s() - writer_cpu, close_s=t_end - t_close,
                losses=list(trainer.losses))
