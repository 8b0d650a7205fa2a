"""What checkpoints cost: time and bytes per save, and their share of training time.

    trainlab bench checkpoint                          # 2 gloo workers on CPU, model=small, DDP
    trainlab bench checkpoint --every 5 --repeats 3 parallel=fsdp train.max_steps=40
    torchrun --nproc-per-node 2 -m trainlab.bench.checkpoint_cost cluster.device=cuda

Every trial runs through run_trial in the same worker processes (one process group), alternating
train.checkpoint_every=0 (no saves) and =--every for --repeats rounds, so drift on a shared
machine hits both alike. Each trial writes into its own fresh folder (removed at the end) and
never resumes. Rank 0 prints each save's ckpt/save_s and ckpt/size_mb as the trainer logged them
(medians over all saves), the median step time of the trials without saves (train/step_time_s,
steps after the first), and two estimates of the cost of one save inside the loop: the logged
save time, and the end-to-end difference in the loop's wall time (with - without) divided by the
saves. Last, the share of training time at TrainConfig's default interval:
`amortised at every N steps: X% of step time (target < 2%)` = save_s / (N x step_time_s).

Checksums: the part of each save spent hashing its files (ckpt/checksum_s, each rank its share),
and what the driver's check before a resume costs: after each trial with saves, rank 0 reads every
file of each checkpoint it kept back against its SHA-256 (engine/resume.py, as `trainlab train`
does before launch), once as the files lie in the page cache after the save (warm) and once after
dropping their pages (posix_fadvise DONTNEED: cold, read from the disk), printed beside the save.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from trainlab import names
from trainlab.bench.spawn import spawn_rows
from trainlab.plan.here import plan_here
from trainlab.vocab.tracker import NullTracker

DEFAULTS = ("model=small", "train.max_steps=30", "parallel=ddp")
# nothing but training steps and saves inside the timed loop; every step's time is logged
FIXED = ("tracking=none", "train.eval_every=0", "train.eval_batches=1", "train.numerics_every=0",
         "train.log_every=1", "train.resume=never")
TARGET = 0.02
"""The issue's budget: checkpoints cost under 2 % of step time at the default interval."""


class _Recorder(NullTracker):
    """A Tracker that keeps rank 0's metrics in memory (the bench reads what the trainer logged)."""

    def __init__(self):
        self.metrics: list[tuple[int, dict]] = []

    def log_metrics(self, metrics, *, step):
        self.metrics.append((step, dict(metrics)))

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(s, m[key]) for s, m in self.metrics if key in m]


def run_rounds(overrides: list[str], *, every: int, repeats: int, world: int,
               root: str | None = None) -> list[dict]:
    """Every (round, interval) trial in this process; rank 0's rows (the others' are empty of
    metrics). Checkpoints go under `root` (default: a fresh temporary folder, removed after)."""
    from trainlab.config import compose_run_config
    from trainlab.distributed import gather_strings, setup_distributed
    from trainlab.engine.run import run_trial
    from trainlab.models import count_params, resolve_dims

    base = compose_run_config([*overrides, *FIXED, f"cluster.num_workers={world}"])
    dist_info = setup_distributed(base.cluster.device)
    made = root is None and dist_info.is_rank0
    # every rank writes into the folder rank 0 made
    root = gather_strings(tempfile.mkdtemp(prefix="trainlab-bench-ckpt-") if made else (root or ""))[0]
    from trainlab.data import build_corpus

    num_params = count_params(resolve_dims(base.model, vocab_size=build_corpus(base.data).vocab_size))
    rows = []
    try:
        for i in range(repeats):
            for k in (0, every):
                folder = Path(root) / f"round{i}_every{k}"
                run = compose_run_config([*overrides, *FIXED, f"cluster.num_workers={world}",
                                          f"train.checkpoint_every={k}", f"train.checkpoint_dir={folder}"])
                rec = _Recorder()
                result = run_trial(plan_here(run), tracker_factory=lambda *_, rec=rec: rec)
                rows.append({"round": i, "every": k, "status": result.status, "steps": result.steps,
                             "elapsed_s": result.elapsed_s,
                             "step_times": [v for s, v in rec.series(names.STEP_TIME_S) if s > 1],
                             "steps_sum_s": sum(v for _, v in rec.series(names.STEP_TIME_S)),
                             "save_s": [v for _, v in rec.series(names.CKPT_SAVE_S)],
                             "size_mb": [v for _, v in rec.series(names.CKPT_SIZE_MB)],
                             "checksum_s": [v for _, v in rec.series(names.CKPT_CHECKSUM_S)],
                             **(verify_times(folder) if k and dist_info.is_rank0 else {"verify": []}),
                             "device": result.extra["device"], "num_params": num_params,
                             "parallel": run.parallel.name})
    finally:
        gather_strings("")  # a barrier: every rank is done writing before the folder goes
        if made:
            shutil.rmtree(root, ignore_errors=True)
    return rows


def verify_times(folder: Path) -> dict:
    """{'verify': [(warm s, cold s, MiB)]}: the driver's check of each checkpoint kept in `folder`."""
    from trainlab.config.checkpoints import complete_checkpoints
    from trainlab.engine.resume import check_checkpoint, verify_here

    out = []
    for ckpt in complete_checkpoints(folder):
        files = [p for p in ckpt.path.iterdir() if p.is_file()]
        t0 = time.perf_counter()
        check_checkpoint(ckpt.path, verify=verify_here)
        warm = time.perf_counter() - t0
        for p in files:  # their pages out of the cache (clean after the save's fsync)
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        t0 = time.perf_counter()
        check_checkpoint(ckpt.path, verify=verify_here)
        out.append((warm, time.perf_counter() - t0, sum(p.stat().st_size for p in files) / 2**20))
    return {"verify": out}


def summarise(rows: list[dict], *, every: int, world: int) -> dict:
    """The bench's numbers from rank 0's rows (see the module docstring)."""
    from trainlab.config.schema import TrainConfig

    off = [r for r in rows if r["every"] == 0]
    on = [r for r in rows if r["every"] == every]
    saves = [s for r in on for s in r["save_s"]]
    sizes = [s for r in on for s in r["size_mb"]]
    if not saves:
        raise ValueError(f"no checkpoint was saved: --every={every} must be below train.max_steps "
                         f"({on[0]['steps'] if on else '?'})")
    step_s = statistics.median(t for r in off for t in r["step_times"])
    save_s = statistics.median(saves)
    # the loop's wall time with saves minus without, per save: what a save costs the run
    e2e = (sum(r["elapsed_s"] for r in on) - sum(r["elapsed_s"] for r in off)) / len(saves)
    interval = TrainConfig().checkpoint_every
    size_mb = statistics.median(sizes)
    num_params = rows[0]["num_params"]
    checksum = [c for r in on for c in r["checksum_s"]]
    verify = [v for r in on for v in r["verify"]]
    warm, cold = (statistics.median(v[i] for v in verify) if verify else float("nan") for i in (0, 1))
    return {
        "device": rows[0]["device"], "world": world, "parallel": rows[0]["parallel"],
        "num_params": num_params, "every": every, "repeats": len(on),
        "statuses": sorted({r["status"] for r in rows}),
        "num_saves": len(saves), "save_s_median": save_s, "save_s_max": max(saves),
        "size_mb": size_mb, "bytes_per_param": size_mb * 2**20 / num_params,
        "num_steps_timed": sum(len(r["step_times"]) for r in off), "step_s_median": step_s,
        "step_s_median_with_saves": statistics.median(t for r in on for t in r["step_times"]),
        "e2e_per_save_s": e2e, "interval": interval, "rows": rows,
        "share": save_s / (interval * step_s), "share_e2e": e2e / (interval * step_s),
        "checksum_s_median": statistics.median(checksum) if checksum else float("nan"),
        "num_verified": len(verify), "verify_warm_s": warm, "verify_cold_s": cold,
        "verify_mib": statistics.median(v[2] for v in verify) if verify else float("nan"),
    }


def report(s: dict) -> list[str]:
    """The lines rank 0 prints."""
    lines = [
        f"checkpoint bench: {s['parallel']} x{s['world']} on {s['device']}, {s['num_params']:,} parameters, "
        f"{s['repeats']} round(s) of every=0 / every={s['every']}, trials {'/'.join(s['statuses'])}",
        "per trial: the loop's wall time = its steps (all, first included) + saves + the rest",
        *(f"round {r['round']} every={r['every']:<3} loop {r['elapsed_s']:7.2f} s = steps {r['steps_sum_s']:7.2f} "
          f"+ saves {sum(r['save_s']):5.2f} + rest {r['elapsed_s'] - r['steps_sum_s'] - sum(r['save_s']):5.2f}  "
          f"median step {statistics.median(r['step_times']):.4f} s  saves [{' '.join(f'{v:.2f}' for v in r['save_s'])}]"
          + (f"  verify warm/cold [{' '.join(f'{w:.2f}/{c:.2f}' for w, c, _ in r['verify'])}]"
             if r["verify"] else "")
          for r in s["rows"]),
        f"save ({s['num_saves']} saves): median {s['save_s_median']:.3f} s, max {s['save_s_max']:.3f} s",
        f"size: {s['size_mb']:.2f} MiB = {s['bytes_per_param']:.2f} bytes/parameter "
        "(fp32 params + 2 Adam moments = 12)",
        f"step time (median of {s['num_steps_timed']} steps without saves): {s['step_s_median']:.4f} s "
        f"(with saves: {s['step_s_median_with_saves']:.4f} s)",
        f"end to end: (wall with saves - without) / saves = {s['e2e_per_save_s']:.3f} s per save "
        f"({s['share_e2e']:.1%} at every {s['interval']} steps)",
        f"checksums at save: median {s['checksum_s_median']:.3f} s of a save's {s['save_s_median']:.3f} s "
        f"({s['checksum_s_median'] / s['save_s_median']:.0%})",
        f"verify before a resume ({s['num_verified']} checkpoints of {s['verify_mib']:.2f} MiB, every file "
        f"read back): median {s['verify_warm_s']:.3f} s warm, {s['verify_cold_s']:.3f} s cold "
        f"({s['verify_mib'] / s['verify_cold_s']:.0f} MiB/s) = "
        f"{s['verify_cold_s'] / s['save_s_median']:.2f} x a save",
        f"amortised at every {s['interval']} steps: {s['share']:.1%} of step time (target < {TARGET:.0%})",
    ]
    return lines


def spawn(overrides: list[str], *, every: int, repeats: int, world: int,
          root: str | None = None) -> list[dict]:
    """Run the rounds in `world` spawned gloo workers on this machine; rank 0's rows."""
    return spawn_rows(run_rounds, world=world, overrides=overrides, every=every, repeats=repeats, root=root)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="trainlab bench checkpoint", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="gloo workers to spawn outside torchrun (default 2)")
    ap.add_argument("--every", type=int, default=5, help="train.checkpoint_every of the trials with saves (default 5)")
    ap.add_argument("--repeats", type=int, default=2, help="rounds of without / with saves (default 2)")
    ap.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary folder, removed after)")
    ap.add_argument("overrides", nargs="*", default=[],
                    help=f"Hydra overrides of the trial (default: {' '.join(DEFAULTS)} cluster.device=cpu)")
    args = ap.parse_args(argv)
    if args.workers < 1 or args.repeats < 1 or args.every < 1:
        ap.error(f"--workers={args.workers} --repeats={args.repeats} --every={args.every}: each must be >= 1")
    under_torchrun = "WORLD_SIZE" in os.environ
    overrides = [*DEFAULTS, *([] if under_torchrun else ["cluster.device=cpu"]), *args.overrides]
    root = str(Path(args.dir).resolve()) if args.dir else None
    if under_torchrun:
        world = int(os.environ["WORLD_SIZE"])
        rows = run_rounds(overrides, every=args.every, repeats=args.repeats, world=world, root=root)
        if int(os.environ.get("RANK", "0")) != 0:
            return
    else:
        world = args.workers
        rows = spawn(overrides, every=args.every, repeats=args.repeats, world=world, root=root)
    try:
        summary = summarise(rows, every=args.every, world=world)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    for line in report(summary):
        print(line, flush=True)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
