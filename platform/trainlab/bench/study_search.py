"""A search against a grid of the same budget, side by side in one run, each through the real
command (`trainlab train -m`, Hydra's sweepers, one local Ray cluster per multirun, one store):

1. grid: the basic sweeper over --choice (default optim.warmup_steps=0,30,100) x learning rates
   log-spaced over --lr, --trials trials in all;
2. study: Hydra's Optuna sweeper, TPE (seeded), the same space with the learning rate as a log
   interval, --trials trials, --concurrency at a time (n_jobs);
3. pruned: the same study (or, --pruned-of grid, the same grid: the same configurations, so the
   pruner alone decides whether the best is found) with hydra.launcher.prune (default median,
   Optuna's MedianPruner).

Per multirun it prints its best configuration (lowest val loss of a finished trial), its parent
runs (a study must be one, however many batches), the gangs it started (warm gangs: the
concurrency, not the batches), its wall time, the trials' training time and
`ratio (<mode>): X.XXX` = wall / (sum of training / concurrency), 1.0 meaning that composing,
scheduling, gang starts and tracking cost nothing; then the study's best against the grid's and
the compute the pruned multirun saved: 1 - its trials' tokens / the unpruned one's, and whether
it found the unpruned one's best configuration.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trainlab import names
from trainlab.console import console, fmt

CHOICE = "optim.warmup_steps=0,30,100"
"""The space's categorical dimension (on this CPU bf16 trains 3x slower than fp32, so precision=fp32,bf16
makes the bench an hour long; it is the --choice to give on a GPU)."""
DEFAULTS = ["model=small", "train.max_steps=300", "train.eval_every=30", "train.global_batch_size=8",
            "train.micro_batch_size=8", "train.seq_len=64", "cluster.num_workers=1", "tracking.system_metrics=false"]
"""The trials `trainlab bench sweep` times (small x 300 steps), validating every 30 steps for the pruners."""


@dataclass
class Multirun:
    mode: str
    wall_s: float
    concurrency: int
    rows: list[dict]
    """sweep_timing.json's trials."""
    parents: int
    trials: list  # MLflow runs of its trials

    @property
    def train_s(self) -> float:
        return sum(r["train_s"] or 0 for r in self.rows)

    @property
    def ratio(self) -> float:
        return self.wall_s / (self.train_s / max(1, self.concurrency))

    @property
    def gang_starts(self) -> int:
        return sum(1 for r in self.rows if r["gang"] and not r["gang"].startswith("warm"))

    @property
    def tokens(self) -> int:
        return int(sum(r.data.metrics.get(names.TOKENS_SEEN, 0) for r in self.trials))

    def best(self) -> tuple[str, float] | None:
        done = [r for r in self.trials if r.data.tags.get(names.TAG_STATUS) == names.STATUS_FINISHED
                and math.isfinite(r.data.metrics.get(names.VAL_LOSS, math.nan))]
        if not done:
            return None
        r = min(done, key=lambda r: r.data.metrics[names.VAL_LOSS])
        return r.data.tags.get(names.TAG_OVERRIDES, "?"), r.data.metrics[names.VAL_LOSS]


def _say(line: str) -> None:
    console.print(line, soft_wrap=True, markup=False)  # one line each: scripts grep them


def _run(mode: str, args: list[str], *, root: Path, env: dict) -> Multirun:
    """One multirun through the real command, its output passed through as it comes."""
    from mlflow.tracking import MlflowClient

    sweep_dir = root / mode
    cmd = [str(Path(sys.executable).parent / "trainlab"), "train", "-m", *args, f"sweep_name=bench_{mode}",
           f"tracking.experiment=bench_{mode}", f"hydra.sweep.dir={sweep_dir}"]
    _say(f"---- {mode}: {' '.join(cmd[1:])}")
    with subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
        for line in p.stdout:
            if "trials done" in line or line.startswith(("[", "result:", "sweep ", "running ")):
                print(f"  {mode}: {line.rstrip()}", flush=True)  # progress: each trial as it ends
        if p.wait() != 0:
            raise SystemExit(f"bench study: the {mode} multirun exited {p.returncode}; see its lines above")
    timing = json.loads((sweep_dir / "sweep_timing.json").read_text())
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name(f"bench_{mode}").experiment_id
    runs = client.search_runs([exp], max_results=10_000)
    parents = [r for r in runs if r.data.tags.get(names.TAG_ROLE) == names.ROLE_SWEEP]
    trials = [r for r in runs if r.data.tags.get(names.TAG_ROLE) == names.ROLE_TRIAL]
    return Multirun(mode=mode, wall_s=timing["wall_s"], concurrency=timing["concurrency"], rows=timing["trials"],
                    parents=len(parents), trials=trials)


def _grid_lrs(low: float, high: float, n: int) -> list[str]:
    return [f"{low * (high / low) ** (i / max(1, n - 1)):.3g}" for i in range(n)]


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="trainlab bench study", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=12, help="trials of each multirun (default 12)")
    ap.add_argument("--concurrency", type=int, default=2, help="trials at once: the study's n_jobs (default 2)")
    ap.add_argument("--lr", nargs=2, type=float, default=(1e-4, 3e-2), metavar=("LOW", "HIGH"),
                    help="the learning rate's range (default 1e-4 3e-2)")
    ap.add_argument("--choice", default=CHOICE, help=f"the categorical dimension, KEY=V1,V2,... (default {CHOICE})")
    ap.add_argument("--prune", default="median", help="hydra.launcher.prune of the pruned study (default median)")
    ap.add_argument("--no-pruned", action="store_true", help="skip the pruned multirun")
    ap.add_argument("--pruned-of", choices=("study", "grid"), default="study",
                    help="what the pruned multirun prunes: the study (default) or the grid")
    ap.add_argument("--no-study", action="store_true", help="skip the (unpruned) study: grid and pruned grid only")
    ap.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    ap.add_argument("overrides", nargs="*", default=[], help="Hydra overrides of every trial")
    args = ap.parse_args(argv)
    key, _, values = args.choice.partition("=")
    if not key or not values:
        raise SystemExit(f"bench study: --choice {args.choice!r} is not KEY=V1,V2,...; e.g. --choice {CHOICE}")
    per_lr = max(1, args.trials // len(values.split(",")))
    grid = _grid_lrs(*args.lr, per_lr)
    base = [*DEFAULTS, *args.overrides, f"hydra.launcher.max_concurrent_trials={args.concurrency}"]
    space = [args.choice, f"optim.lr=tag(log,interval({args.lr[0]:g},{args.lr[1]:g}))"]
    study = [*base, "hydra/sweeper=optuna", f"hydra.sweeper.n_trials={args.trials}",
             f"hydra.sweeper.n_jobs={args.concurrency}", f"hydra.sweeper.sampler.seed={args.seed}",
             f"hydra.sweeper.sampler.n_startup_trials={min(args.trials // 2, 10)}", *space]
    with tempfile.TemporaryDirectory(prefix="bench-study-") as tmp:
        root = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env.update(MLFLOW_TRACKING_URI=f"sqlite:///{root / 'bench.db'}", PYTHONUNBUFFERED="1", COLUMNS="200")
        grid_args = [*base, args.choice, f"optim.lr={','.join(grid)}"]
        runs = {"grid": _run("grid", grid_args, root=root, env=env)}
        if not args.no_study:
            runs["study"] = _run("study", study, root=root, env=env)
        if not args.no_pruned:
            unpruned = grid_args if args.pruned_of == "grid" else study
            runs["pruned"] = _run("pruned", [*unpruned, f"hydra.launcher.prune={args.prune}",
                                             "hydra.launcher.prune_startup_trials=2"], root=root, env=env)
    for m in runs.values():
        best = m.best()
        _say(f"{m.mode}: {len(m.rows)} trials, {m.parents} parent run(s), {m.gang_starts} gangs started, "
             f"concurrency {m.concurrency}, wall {m.wall_s:.1f}s, sum of training {m.train_s:.1f}s, "
             f"{m.tokens:,} tokens; best {best[0] if best else '-'} val {fmt(best and best[1], '.4f')}")
        _say(f"ratio ({m.mode}): {m.ratio:.3f}")
    grid_best = runs["grid"].best()
    study_best = runs["study"].best() if "study" in runs else None
    if grid_best and study_best:
        _say(f"study vs grid: best val loss {study_best[1]:.4f} vs {grid_best[1]:.4f} "
             f"({'same or better' if study_best[1] <= grid_best[1] else 'worse'}), "
             f"ratio {runs['study'].ratio:.3f} vs {runs['grid'].ratio:.3f}")
    unpruned = runs.get(args.pruned_of)
    if "pruned" in runs and unpruned is not None and unpruned.tokens and unpruned.best():
        pruned, (config, loss) = runs["pruned"], unpruned.best()
        pruned_best = pruned.best()
        same = pruned_best is not None and pruned_best[0] == config
        _say(f"pruned vs unpruned {args.pruned_of}: compute saved {1 - pruned.tokens / unpruned.tokens:.1%} "
             f"({pruned.tokens:,} vs {unpruned.tokens:,} tokens), best val loss "
             f"{fmt(pruned_best and pruned_best[1], '.4f')} vs {loss:.4f} "
             f"({'the same configuration' if same else 'another configuration'}: "
             f"{pruned_best[0] if pruned_best else '-'} vs {config})")
