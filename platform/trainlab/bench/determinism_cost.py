"""The cost of train.deterministic: DDP with the backend's all-reduce against the fixed-order sum.

    trainlab bench determinism                         # 2 gloo workers on CPU, model=tiny
    trainlab bench determinism --workers 2 --repeats 2 model=small train.max_steps=20
    torchrun --nproc-per-node 2 -m trainlab.bench.determinism_cost cluster.device=cuda

Every trial runs through run_trial in the same worker processes (one process group), the modes
alternating off / on for --repeats rounds so drift on a shared machine hits both alike.
Outside torchrun the workers are spawned here (gloo, CPU). Rank 0 prints each trial's tokens/s
(the trial's median over the steps after the first) and checksums, then per mode the median
tokens/s, whether the repeats' loss-curve and parameter checksums matched, and last
`cost: X.XXx` = off tokens/s / on tokens/s (1.10 = deterministic mode is 10 % slower).
"""

from __future__ import annotations

import argparse
import os
import statistics

from trainlab import names
from trainlab.bench.spawn import spawn_rows
from trainlab.plan.here import plan_here

DEFAULTS = ("model=tiny", "data=markov", "train.max_steps=20", "train.global_batch_size=16",
            "train.micro_batch_size=4", "train.seq_len=64")
# nothing but training steps inside the timed loop
FIXED = ("tracking=none", "train.eval_every=0", "train.numerics_every=0", "parallel=ddp")
MODES = (False, True)


def run_rounds(overrides: list[str], *, repeats: int, world: int) -> list[dict]:
    """Every (round, mode) trial in this process; rank 0's rows (identical on every rank)."""
    from trainlab.config import compose_run_config
    from trainlab.engine.run import run_trial

    rows = []
    for i in range(repeats):
        for mode in MODES:
            run = compose_run_config([*overrides, *FIXED, f"train.deterministic={str(mode).lower()}",
                                      f"cluster.num_workers={world}"])
            result = run_trial(plan_here(run))
            rows.append({"round": i, "deterministic": mode, "status": result.status,
                         "tokens_per_s": result.tokens_per_s,
                         "loss_sha": result.extra[names.TAG_LOSS_CURVE_SHA],
                         "params_sha": result.extra[names.TAG_PARAMS_SHA],
                         "param_norm": result.extra[names.PARAM_NORM]})
    return rows


def report(rows: list[dict], *, world: int, overrides: list[str]) -> list[str]:
    """The lines rank 0 prints: one per trial, one per mode, then the cost."""
    lines = [f"determinism bench: DDP x{world}, {' '.join(overrides)}",
             "tokens/s: the trial's median per step after the first; sha: first 12 hex"]
    for r in rows:
        lines.append(f"round {r['round']} deterministic={str(r['deterministic']).lower():<5} "
                     f"{r['tokens_per_s']:>10,.0f} tokens/s  loss {r['loss_sha'][:12]}  "
                     f"params {r['params_sha'][:12]}  norm {r['param_norm']:.12g}  {r['status']}")
    medians = {}
    for mode in MODES:
        mine = [r for r in rows if r["deterministic"] == mode]
        medians[mode] = statistics.median(r["tokens_per_s"] for r in mine)
        same_loss = len({r["loss_sha"] for r in mine}) == 1
        same_params = len({r["params_sha"] for r in mine}) == 1
        lines.append(f"deterministic={str(mode).lower()}: {medians[mode]:,.0f} tokens/s (median of "
                     f"{len(mine)}); repeats match: loss curve {'yes' if same_loss else 'no'}, "
                     f"params {'yes' if same_params else 'no'}")
    across = len({r["params_sha"] for r in rows}) == 1
    lines.append(f"both modes the same parameters: {'yes' if across else 'no'}")
    lines.append(f"cost: {medians[False] / medians[True]:.2f}x")
    return lines


def spawn(overrides: list[str], *, repeats: int, world: int) -> list[dict]:
    """Run the rounds in `world` spawned gloo workers on this machine; rank 0's rows."""
    return spawn_rows(run_rounds, world=world, overrides=overrides, repeats=repeats)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="trainlab bench determinism", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="gloo workers to spawn outside torchrun (default 2)")
    ap.add_argument("--repeats", type=int, default=2, help="rounds of off / on (default 2)")
    ap.add_argument("overrides", nargs="*", default=[],
                    help=f"Hydra overrides of the trial (default: {' '.join(DEFAULTS)} cluster.device=cpu)")
    args = ap.parse_args(argv)
    if args.workers < 2 or args.repeats < 1:
        ap.error(f"--workers={args.workers} --repeats={args.repeats}: data parallel needs --workers >= 2 "
                 "and a comparison --repeats >= 1")
    under_torchrun = "WORLD_SIZE" in os.environ
    overrides = [*DEFAULTS, *([] if under_torchrun else ["cluster.device=cpu"]), *args.overrides]
    if under_torchrun:
        world = int(os.environ["WORLD_SIZE"])
        rows = run_rounds(overrides, repeats=args.repeats, world=world)
        if int(os.environ.get("RANK", "0")) != 0:
            return
    else:
        world = args.workers
        rows = spawn(overrides, repeats=args.repeats, world=world)
    for line in report(rows, world=world, overrides=overrides):
        print(line, flush=True)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
