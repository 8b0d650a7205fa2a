"""Sweep overhead, gangs per trial vs warm gangs vs gangs kept warm, side by side in one run:
the same K short trials through the sweep runner on one local Ray cluster, first with a Ray
Train gang per trial (hydra.launcher.reuse_gangs=false), then on warm gangs (the default), kept
warm after that sweep (hydra.launcher.keep_warm_s), then as a second sweep on the gangs the
first kept: what a later command on a running cluster meets. Each sweep is a study of its own,
as each command's is; only the keepers (launch.kept_gang) outlive one.

Per mode it prints the start latency (a trial's request to its first optimizer step) of the
sweep's first trial, of the first trial of each gang and of the trials after it on a warm gang, the sweep's wall time, the
sum of the trials' own training time and `ratio (<mode>): X.XXX` = wall / (sum of training /
concurrency): 1.0 would mean scheduling, process start-up and tracking cost nothing. A last
line compares the modes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trainlab.config import compose_run_config
from trainlab.console import console, fmt
from trainlab.launch.kept_gang import end_kept_gangs
from trainlab.launch.ray_trial import connect
from trainlab.launch.sweep import SweepOutcome, Trial, execute_sweep

DEFAULTS = ["model=tiny", "train.max_steps=100", "train.eval_every=0", "train.global_batch_size=8",
            "train.micro_batch_size=8", "train.seq_len=64", "cluster.num_workers=1",
            "tracking.system_metrics=false"]
KEEP_WARM_S = 600
"""hydra.launcher.keep_warm_s of the warm sweep and the second one (their keepers are ended after)."""
MODES = {"per-trial gangs": (False, 0), "warm gangs": (True, KEEP_WARM_S), "kept-warm gangs, second sweep": (True, KEEP_WARM_S)}
"""Mode name -> (hydra.launcher.reuse_gangs, hydra.launcher.keep_warm_s)."""


@dataclass
class ModeResult:
    name: str
    trials: list[Trial]
    outcome: SweepOutcome

    @property
    def train_s(self) -> list[float]:
        return [t.result.elapsed_s for t in self.trials if t.result]

    def latencies(self, *, warm: bool) -> list[float]:
        """Start latencies of the trials that ran after another on their gang (warm) or that
        started a gang (not warm)."""
        return [t.start_latency_s for t in self.trials
                if t.start_latency_s is not None and t.gang.startswith("warm") == warm]

    def overheads(self, *, warm: bool) -> list[float]:
        """Per trial, its wall time (request to its run closed) minus its training time."""
        return [t.ended_at - t.submitted_at - t.result.elapsed_s for t in self.trials
                if t.result and t.gang.startswith("warm") == warm]

    @property
    def first_start_s(self) -> float | None:
        """The start latency of the sweep's first trial (the first submitted)."""
        first = min(self.trials, key=lambda t: t.submitted_at)
        return first.start_latency_s

    @property
    def ratio(self) -> float:
        return self.outcome.wall_s / (sum(self.train_s) / self.outcome.concurrency)


def _trials(overrides: list[str], *, k: int, tmp: Path, first_seed: int, experiment: str) -> list[Trial]:
    out = []
    for i in range(k):
        seed = first_seed + i
        run = compose_run_config([*overrides, f"seed={seed}", f"sweep_name={experiment}",
                                  f"tracking.experiment={experiment}",
                                  f"tracking.uri=sqlite:///{tmp / 'bench.db'}",
                                  f"output_dir={tmp / experiment / f'trial{seed}'}"])
        out.append(Trial(idx=i, overrides=[f"seed={seed}"], run=run))
    return out


def _median(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f}s ({len(xs)})" if xs else "- (0)"


def _say(line: str) -> None:
    console.print(line, soft_wrap=True)  # one line each, whatever the width: scripts grep them


def report(m: ModeResult) -> None:
    o = m.outcome
    _say(f"{m.name}: {len(m.trials)} trials, concurrency {o.concurrency}, wall {o.wall_s:.1f}s, "
         f"sum of training {sum(m.train_s):.1f}s, ideal wall {sum(m.train_s) / o.concurrency:.1f}s, "
         f"gangs started {sum(not t.gang.startswith('warm') for t in m.trials)}")
    _say(f"{m.name}: the sweep's first trial starts in {fmt(m.first_start_s, '.1f')}s")
    _say(f"{m.name}: start latency (request to first step), median: first trial of a gang "
         f"{_median(m.latencies(warm=False))}, later trials of a warm gang {_median(m.latencies(warm=True))}")
    _say(f"{m.name}: trial wall minus its training, median: first trial of a gang "
         f"{_median(m.overheads(warm=False))}, later trials of a warm gang {_median(m.overheads(warm=True))}")
    _say(f"ratio ({m.name}): {m.ratio:.3f}")


def compare(old: ModeResult, new: ModeResult) -> None:
    later, each = new.latencies(warm=True), old.latencies(warm=False)
    _say(f"{new.name} vs {old.name}: wall {new.outcome.wall_s:.1f}s vs {old.outcome.wall_s:.1f}s "
         f"({old.outcome.wall_s / new.outcome.wall_s:.2f}x faster), ratio {new.ratio:.3f} vs {old.ratio:.3f}, "
         f"start latency median {fmt(statistics.median(later) if later else None, '.1f')}s (later trials of a "
         f"warm gang) vs {fmt(statistics.median(each) if each else None, '.1f')}s (every trial its own gang)")


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="trainlab bench sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=8, help="trials in each measured sweep (default 8)")
    ap.add_argument("--concurrency", type=int, default=2, help="trials at once (default 2)")
    ap.add_argument("--no-warmup", action="store_true",
                    help="skip the unmeasured first trial that starts Ray and fills the OS caches")
    ap.add_argument("overrides", nargs="*", default=[], help="Hydra overrides of every trial")
    args = ap.parse_args(argv)
    overrides = [*DEFAULTS, *args.overrides]
    results = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        warm = _trials(overrides, k=1, tmp=tmp, first_seed=1000, experiment="bench_sweep_warmup")
        connect(warm[0].run)
        if not args.no_warmup:
            console.print("warming the cluster with one trial (not measured) ...")
            execute_sweep(warm, max_concurrent_trials=1, rerun=True, reuse_gangs=False)
        try:
            for i, (name, (reuse, keep)) in enumerate(MODES.items()):
                console.print(f"---- {name} (hydra.launcher.reuse_gangs={str(reuse).lower()} "
                              f"hydra.launcher.keep_warm_s={keep}) ----")
                trials = _trials(overrides, k=args.trials, tmp=tmp, first_seed=0, experiment=f"bench_sweep_{i}")
                outcome = execute_sweep(trials, max_concurrent_trials=args.concurrency, rerun=True, reuse_gangs=reuse,
                                        keep_warm_s=keep)
                if any(not t.result for t in trials):
                    raise SystemExit(f"bench sweep: some trials of the {name} sweep did not finish; see the table above")
                results.append(ModeResult(name=name, trials=trials, outcome=outcome))
        finally:
            end_kept_gangs()
    for m in results:
        report(m)
    compare(*results[:2])
    compare(results[0], results[2])
