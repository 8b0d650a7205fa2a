"""Balanced data parallel side by side: equal, weighted and accumulate shares, one slow worker.

    trainlab bench balance                          # 2 gloo workers on CPU, the last one 2x slower
    trainlab bench balance --slowdown 3 --modes equal,weighted model=small train.max_steps=30
    torchrun --nproc-per-node 4 -m trainlab.bench.balance_modes ...   # in a torchrun world instead

Without a torchrun world it spawns --workers processes (gloo, one torch thread each). The last
worker is an emulated slower device (debug.slowdown: it sleeps (f - 1) x its measured
compute before its gradients sync). Every mode trains the same model, seed and tokens in these
same processes, one after another: equal (parallel.dp_balance=equal, the reference), weighted
and accumulate with measured weights (parallel.dp_weights empty: equal shares for
parallel.dp_balance_warmup steps, then each rank's measured rate). Rank 0 prints, per mode,
tokens/s (the trial's median step after the first), its ratio to equal, each rank's share and
its compute and all-reduce wait per step (mean over the second half of the steps), then one
line per mode: `mode weighted: speedup: X.XXx`.

On a CPU shared with other work the numbers are noisy: a balanced mode keeps every worker busy
at once, so it is the first to lose when other processes want the same cores.
"""

from __future__ import annotations

import argparse
import gc
import math
import os

import torch

from trainlab import names
from trainlab.bench.layout_speed import gather_rows
from trainlab.config import compose_run_config
from trainlab.console import print0
from trainlab.distributed import close_distributed, setup_distributed
from trainlab.engine.run import build_trainer
from trainlab.plan.trial_plan import Where, plan_trial
from trainlab.vocab.tracker import NullTracker

MODES = ("equal", "weighted", "accumulate")
DEFAULTS = ("model=tiny", "train.max_steps=20", "train.seq_len=128", "train.global_batch_size=32",
            "train.micro_batch_size=8")
# nothing but training steps in the timed loop; per-rank times averaged over the second half
FIXED = ("tracking=none", "train.eval_every=0", "cluster.device=cpu")


class _Latest(NullTracker):
    """Keeps the latest value of every metric rank 0 logs (the per-rank times and shares)."""

    def __init__(self) -> None:
        self.latest: dict[str, float] = {}

    def log_metrics(self, metrics: dict[str, float], *, step: int) -> None:
        self.latest.update(metrics)


def run_mode(overrides: list[str], mode: str, *, world: int, slowdown: float) -> dict:
    """Train with parallel.dp_balance=`mode` in this process; rank 0's row (other ranks: {})."""
    factors = [1.0] * (world - 1) + [slowdown]
    run = compose_run_config([*overrides, f"parallel.dp_balance={mode}", f"cluster.num_workers={world}",
                              f"debug.slowdown=[{','.join(map(str, factors))}]", *FIXED,
                              f"train.numerics_every={max(1, _steps(overrides) // 2)}"])
    dist_info = setup_distributed(run.cluster.device)  # joins the group only the first time
    torch.set_num_threads(run.cluster.cpus_per_worker)
    tracker = _Latest()
    trainer = build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info, tracker=tracker)
    result = trainer.train()
    m = tracker.latest
    row = {"mode": mode, "status": result.status, "tokens_per_s": result.tokens_per_s, "ranks": []}
    for r in range(world):
        get = lambda key, r=r: m.get(names.rank_metric(r, key), math.nan)  # noqa: E731
        row["ranks"].append({"share": get(names.RANK_DP_SHARE), "compute_s": get(names.RANK_COMPUTE),
                             "wait_s": get(names.RANK_COMM_WAIT), "step_s": get(names.RANK_STEP_TIME)})
    if mode == "equal":
        for rank in row["ranks"]:
            rank["share"] = run.train.global_batch_size / world
    del trainer
    gc.collect()
    return row if dist_info.is_rank0 else {}


def _steps(overrides: list[str]) -> int:
    last = [o for o in overrides if o.startswith("train.max_steps=")][-1]
    return int(last.split("=", 1)[1])


def print_table(rows: list[dict], *, world: int, slowdown: float, overrides: list[str]) -> None:
    shown = {o.split("=", 1)[0]: o for o in overrides}
    _line(f"balance bench on cpu x{world}, rank {world - 1} slowed {slowdown:g}x: {' '.join(shown.values())}")
    _line("tokens/s: median per step after the first; per rank: sequences per step, compute and "
          "all-reduce wait per step (mean over the second half)")
    ref = rows[0]["tokens_per_s"]
    ranks = "  ".join(f"r{r}: seq compute_s wait_s" for r in range(world))
    _line(f"{'mode':<11} {'tokens/s':>9} {'vs equal':>8}  {ranks}")
    for row in rows:
        row["speedup"] = row["tokens_per_s"] / ref if ref > 0 else math.nan
        per_rank = "  ".join(f"r{r}: {x['share']:>3.0f} {x['compute_s']:>9.3f} {x['wait_s']:>6.3f}"
                             for r, x in enumerate(row["ranks"]))
        _line(f"{row['mode']:<11} {row['tokens_per_s']:>9,.0f} {row['speedup']:>7.2f}x  {per_rank}  {row['status']}")
    for row in rows:
        _line(f"mode {row['mode']}: speedup: {row['speedup']:.2f}x")


def _line(text: str) -> None:
    print0(text, soft_wrap=True, markup=False)


def _worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    """A spawned worker: this process as `rank` of a local gloo world, then the bench."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    _bench(args, world)


def _bench(args: argparse.Namespace, world: int) -> None:
    overrides = [*DEFAULTS, *args.overrides]
    rows = [run_mode(overrides, mode, world=world, slowdown=args.slowdown) for mode in args.modes]
    rows = gather_rows(rows)[0]  # rank 0's rows; a collective, so every rank ends together
    print_table(rows, world=world, slowdown=args.slowdown, overrides=overrides)
    close_distributed()


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="trainlab bench balance", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma-separated parallel.dp_balance modes, the first is the reference "
                         f"(default {','.join(MODES)})")
    ap.add_argument("--workers", type=int, default=2, help="processes to spawn without torchrun (default 2)")
    ap.add_argument("--slowdown", type=float, default=2.0,
                    help="how many times slower the last worker runs (default 2)")
    ap.add_argument("overrides", nargs="*", default=[],
                    help=f"Hydra overrides of the trial (default: {' '.join(DEFAULTS)})")
    args = ap.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in args.modes if m not in MODES]
    if unknown or not args.modes:
        ap.error(f"unknown mode(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(MODES)}")
    if args.slowdown < 1 or args.workers < 2:
        ap.error(f"--slowdown={args.slowdown} must be >= 1 and --workers={args.workers} >= 2")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # already in a torchrun world
        _bench(args, int(os.environ["WORLD_SIZE"]))
        return
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_worker, args=(args.workers, port, args), nprocs=args.workers, start_method="spawn")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
