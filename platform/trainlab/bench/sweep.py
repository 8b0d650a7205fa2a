"""Sweep overhead: K short trials on a warm local Ray cluster, through the sweep runner.

Prints each trial's start latency (submission to its first optimizer step) and training
time, then `ratio: X.XXX` = sweep wall time / (sum of the trials' own training time /
concurrency). 1.0 would mean scheduling, process start-up and tracking cost nothing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from trainlab.config import compose_run_config
from trainlab.console import console
from trainlab.launch.ray_trial import connect
from trainlab.launch.sweep import Trial, execute_sweep

DEFAULTS = ["model=tiny", "train.max_steps=100", "train.eval_every=0", "train.global_batch_size=8",
            "train.micro_batch_size=8", "train.seq_len=64", "cluster.num_workers=1",
            "tracking.system_metrics=false"]


def _trials(overrides: list[str], *, k: int, tmp: Path, first_seed: int) -> list[Trial]:
    out = []
    for i in range(k):
        seed = first_seed + i
        run = compose_run_config([*overrides, f"seed={seed}", "sweep_name=bench_sweep",
                                  "tracking.experiment=bench_sweep",
                                  f"tracking.uri=sqlite:///{tmp / 'bench.db'}",
                                  f"output_dir={tmp / f'trial{seed}'}"])
        out.append(Trial(idx=i, overrides=[f"seed={seed}"], run=run))
    return out


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="trainlab bench sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=4, help="trials in the measured sweep (default 4)")
    ap.add_argument("--concurrency", type=int, default=2, help="trials at once (default 2)")
    ap.add_argument("overrides", nargs="*", default=[], help="Hydra overrides of every trial")
    args = ap.parse_args(argv)
    overrides = [*DEFAULTS, *args.overrides]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        warm = _trials(overrides, k=1, tmp=tmp, first_seed=1000)
        connect(warm[0].run)
        console.print("warming the cluster with one trial (not measured) ...")
        execute_sweep(warm, max_concurrent_trials=1, rerun=True)
        trials = _trials(overrides, k=args.trials, tmp=tmp, first_seed=0)
        outcome = execute_sweep(trials, max_concurrent_trials=args.concurrency, rerun=True)
    train_s = [t.result.elapsed_s for t in trials if t.result]
    latency = [t.start_latency_s for t in trials if t.start_latency_s is not None]
    if len(train_s) < len(trials) or not latency:
        raise SystemExit("bench sweep: some trials did not finish; see the table above")
    ideal = sum(train_s) / outcome.concurrency
    console.print(f"trials {len(trials)}, concurrency {outcome.concurrency}, wall {outcome.wall_s:.1f}s, "
                  f"sum of training {sum(train_s):.1f}s, ideal wall {ideal:.1f}s")
    console.print(f"start latency (request to first step): median {statistics.median(latency):.1f}s, "
                  f"min {min(latency):.1f}s, max {max(latency):.1f}s")
    console.print(f"ratio: {outcome.wall_s / ideal:.3f}")
