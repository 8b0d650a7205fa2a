"""Pruning: the same precision x learning-rate sweep run unpruned and pruned, side by side.

Both sweeps run the same trials (a tiny model on CPU, --concurrency at once, on one warm local
Ray cluster) through the sweep runner; the second with hydra.launcher.prune. Prints per sweep
the optimizer steps and tokens its trials computed, its wall time and the best configuration it
found (the lowest final val loss among its finished trials), then the compute saved:
1 - tokens(pruned) / tokens(unpruned). The two best configurations must be the same one
(exit 1 otherwise): pruning that loses the winner saves nothing worth having.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import tempfile
from pathlib import Path

from rich.table import Table

from trainlab import names
from trainlab.config import compose_run_config
from trainlab.config.prune_rule import PruneConfig, check_prunable
from trainlab.console import console, fmt
from trainlab.launch.ray_trial import connect
from trainlab.launch.sweep import SweepOutcome, Trial, execute_sweep

DEFAULTS = ["model=tiny", "data=markov", "train.max_steps=200", "train.eval_every=20",
            "train.global_batch_size=16", "train.micro_batch_size=16", "train.seq_len=128",
            "cluster.num_workers=1", "tracking.system_metrics=false"]
PRECISIONS = "fp32,bf16"
LRS = "3e-4,3e-3,3e-2"


def _trials(overrides: list[str], grid: list[list[str]], *, name: str, tmp: Path) -> list[Trial]:
    out = []
    for i, point in enumerate(grid):
        run = compose_run_config([*overrides, *point, f"sweep_name={name}", f"tracking.experiment={name}",
                                  f"tracking.uri=sqlite:///{tmp / 'bench.db'}", f"output_dir={tmp / name / str(i)}"])
        out.append(Trial(idx=i, overrides=point, run=run))
    return out


def _totals(trials: list[Trial]) -> tuple[int, int]:
    """(optimizer steps, tokens) the trials computed."""
    results = [t.result for t in trials if t.result is not None]
    return sum(r.steps for r in results), sum(r.tokens_seen for r in results)


def _best(trials: list[Trial]) -> Trial | None:
    """The finished trial with the lowest final val loss."""
    done = [t for t in trials if t.status == names.STATUS_FINISHED and t.result
            and math.isfinite(t.result.final_val_loss)]
    return min(done, key=lambda t: t.result.final_val_loss) if done else None


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="trainlab bench prune", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precisions", default=PRECISIONS, help=f"precision options swept (default {PRECISIONS})")
    ap.add_argument("--lrs", default=LRS, help=f"learning rates swept (default {LRS})")
    ap.add_argument("--concurrency", type=int, default=2, help="trials at once (default 2)")
    ap.add_argument("--rule", default="asha", choices=("margin", "asha"), help="hydra.launcher.prune (default asha)")
    ap.add_argument("--margin", type=float, default=0.1, help="hydra.launcher.prune_margin (default 0.1)")
    ap.add_argument("--grace-tokens", type=int, default=0,
                    help="hydra.launcher.prune_grace_tokens (default 0: a quarter of a trial)")
    ap.add_argument("--reduction-factor", type=float, default=3.0,
                    help="hydra.launcher.prune_reduction_factor (default 3)")
    ap.add_argument("overrides", nargs="*", default=[], help="Hydra overrides of every trial")
    args = ap.parse_args(argv)
    knob = {"prune_margin": args.margin} if args.rule == "margin" else {"prune_reduction_factor": args.reduction_factor}
    try:
        prune = PruneConfig(prune=args.rule, prune_grace_tokens=args.grace_tokens, **knob)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    overrides = [*DEFAULTS, *args.overrides]
    grid = [[f"precision={p}", f"optim.lr={lr}"]
            for p, lr in itertools.product(args.precisions.split(","), args.lrs.split(","))]
    outcomes: dict[str, tuple[list[Trial], SweepOutcome]] = {}
    load: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        warm = _trials(overrides, grid[:1], name="bench_prune_warm", tmp=tmp)
        connect(warm[0].run)
        console.print("warming the cluster with one trial (not measured) ...")
        execute_sweep(warm, max_concurrent_trials=1, rerun=True)
        for mode, rule in (("unpruned", None), ("pruned", prune)):
            trials = _trials(overrides, grid, name=f"bench_prune_{mode}", tmp=tmp)
            if rule is not None:
                try:
                    check_prunable(rule, [t.run for t in trials], [f"#{t.idx}" for t in trials])
                except ValueError as e:
                    raise SystemExit(f"error: {e}") from None
            console.rule(f"{mode} sweep")
            load[mode] = os.getloadavg()[0]
            outcomes[mode] = trials, execute_sweep(trials, max_concurrent_trials=args.concurrency, rerun=True,
                                                   prune=rule)
    _print(outcomes, prune, load=load)


def _print(outcomes: dict[str, tuple[list[Trial], SweepOutcome]], prune: PruneConfig, *,
           load: dict[str, float]) -> None:
    table = Table(title=f"pruning ({prune.prune}): same sweep, unpruned and pruned", title_justify="left")
    for h in ("", *outcomes):
        table.add_column(h)
    totals = {mode: _totals(trials) for mode, (trials, _) in outcomes.items()}
    bests = {mode: _best(trials) for mode, (trials, _) in outcomes.items()}
    failed = {mode: sum(t.status == names.STATUS_FAILED for t in trials) for mode, (trials, _) in outcomes.items()}

    def row(what: str, fn) -> None:
        table.add_row(what, *(fn(mode) for mode in outcomes))

    row("trials", lambda m: f"{len(outcomes[m][0])} ({sum(t.status == names.STATUS_PRUNED for t in outcomes[m][0])}"
                            f" pruned, {failed[m]} failed)")
    row("optimizer steps", lambda m: f"{totals[m][0]:,}")
    row("tokens", lambda m: f"{totals[m][1]:,}")
    row("sum of training s", lambda m: fmt(sum(t.result.elapsed_s for t in outcomes[m][0]
                                               if t.result is not None), ".1f"))
    row("sweep wall s", lambda m: f"{outcomes[m][1].wall_s:.1f}")
    row("best configuration", lambda m: bests[m].label if bests[m] else "-")
    row("its final val loss", lambda m: fmt(bests[m].result.final_val_loss, ".4f") if bests[m] else "-")
    console.print(table)
    (steps_u, tokens_u), (steps_p, tokens_p) = totals["unpruned"], totals["pruned"]
    wall_u, wall_p = outcomes["unpruned"][1].wall_s, outcomes["pruned"][1].wall_s
    same = bests["unpruned"] is not None and bests["pruned"] is not None \
        and bests["unpruned"].label == bests["pruned"].label
    console.print(f"compute saved: {1 - tokens_p / max(1, tokens_u):.1%} of the tokens "
                  f"({1 - steps_p / max(1, steps_u):.1%} of the steps); wall time {wall_p / wall_u:.2f}x")
    # wall times on a shared machine move with its load: say what it was
    console.print(f"load average (1 min) at the start of each sweep: unpruned {load['unpruned']:.1f}, pruned "
                  f"{load['pruned']:.1f}; at the end {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    console.print(f"same best configuration: {'yes' if same else 'NO'}")
    if not same or any(failed.values()):
        raise SystemExit(1)
