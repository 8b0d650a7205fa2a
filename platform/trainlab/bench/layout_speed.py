"""Parallel layouts side by side: the engine on the same model, seed and tokens, one layout after another.

    torchrun --nproc-per-node 2 -m trainlab.bench.layout_speed --layouts ddp,zero1,zero2,fsdp,tp,pp model=small
    trainlab bench parallel --layouts ddp,fsdp model=tiny     # one process: a smoke test only

Every layout (conf/parallel/<layout>.yaml) trains in these same processes, one after another,
on the process group the first one set up; each builds its own DeviceMesh (and its model on
the meta device: no layout's numbers include an unsharded build). Per rank it measures
tokens/s (the trial's median over the steps after the first) and memory, from the trainer's
own rank telemetry at the last step: the bytes of this rank's parameters, gradients and
optimizer state (local shards only, sharded_bytes), side by side with its peak since the
warm-up step (telemetry.peak_memory: allocated device
memory on GPU; the process's peak resident set on CPU, which includes the interpreter and
torch, the same few hundred MB for every layout). Rank 0 prints one table: the slowest
rank's tokens/s and the largest rank's memory, with ratios to the first layout's (the
reference); then one line per layout with `speedup: X.XXx  memory: Y.YYx`, memory being
the peak on GPU and params + grads + optimizer state on CPU (where the peak's fixed
overhead would flatten the ratio). A layout that this world size cannot run is skipped with
its reason: the config's checks raise ValueError (tp on 1 rank), or it would degenerate
(dp_tp, dp_pp, fsdp_tp and hsdp need 4 ranks: on 2, dp or dp_shard would be 1).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import math
import os

import torch
import torch.distributed as dist

from trainlab import names
from trainlab.config import CONF_DIR, compose_run_config
from trainlab.console import print0
from trainlab.distributed import close_distributed, device_name, setup_distributed
from trainlab.engine.run import build_trainer
from trainlab.plan.derive_layout import plan_layout
from trainlab.plan.trial_plan import Where, plan_trial
from trainlab.telemetry.peak_memory import memory_source
from trainlab.vocab.tracker import NullTracker

DEFAULT_LAYOUTS = "ddp,zero1,zero2,fsdp,tp,pp"
# the same trial for every layout: nothing but training steps inside the timed loop
FIXED = ("tracking=none", "train.eval_every=0", "train.numerics_every=0")
MEMORY_COLUMNS = ("params_gb", "grads_gb", "optim_gb", "peak_gb")


def run_layout(overrides: list[str], layout: str, world: int) -> dict:
    """Train `layout` in this process; this rank's numbers, or the reason it was skipped."""
    row: dict = {"layout": layout}
    try:
        run = compose_run_config([*overrides, f"parallel={layout}", f"cluster.num_workers={world}", *FIXED])
        _check_not_degenerate(run)
        dist_info = setup_distributed(run.cluster.device)  # joins the group only the first time
        if dist_info.device.type == "cpu":
            torch.set_num_threads(run.cluster.cpus_per_worker)
        else:
            torch.cuda.empty_cache()  # the trainer resets the peak: this layout's, after its warm-up
        latest = _Latest()
        trainer = build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info, tracker=latest)
    except ValueError as e:  # the config's checks: the same on every rank, before any collective
        return row | {"status": "skipped", "reason": " ".join(str(e).split())}
    result = trainer.train()
    row |= {"status": result.status, "tokens_per_s": result.tokens_per_s,
            "device": dist_info.device.type, "device_name": device_name(dist_info.device),
            "memory_source": memory_source(dist_info.device)}
    if dist_info.is_rank0:
        # the trainer's own per-rank telemetry at the last step (after its optimizer step, before
        # the final evaluation, which leaves FSDP2's unsharded roots gathered): the largest rank's
        # bytes of params, gradients and optimizer state, and its peak since the warm-up step
        m = latest.metrics
        row |= {"params_gb": m[names.PARAM_GB], "grads_gb": m[names.GRAD_GB],
                "optim_gb": m[names.OPTIM_STATE_GB], "peak_gb": m[names.PEAK_MEM_GB_MAX]}
        row["memory_gb"] = row["peak_gb"] if dist_info.device.type == "cuda" else (
            row["params_gb"] + row["grads_gb"] + row["optim_gb"])
    del trainer  # free this layout's model and optimizer before the next one is built
    gc.collect()
    _trim_heap()
    return row


class _Latest(NullTracker):
    """Keeps the latest value of every metric (rank 0's trainer logs the gathered rank metrics)."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    def log_metrics(self, metrics: dict[str, float], *, step: int) -> None:
        self.metrics.update(metrics)


def _trim_heap() -> None:
    """Give the freed heap back to the OS (glibc), so that the next layout's peak resident set
    starts from this process's baseline rather than from what the last layout left cached."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the peak then includes that cache
        pass


def _check_not_degenerate(run) -> None:
    """A layout that combines data parallelism with tp or pp, left to derive dp from the world
    size, must get dp >= 2; otherwise it is only its tp or pp layout under another name."""
    p = run.parallel
    dims = plan_layout(run).dims
    if p.dp == 0 and p.tp * p.pp > 1 and dims.dp == 1:
        raise ValueError(f"dp x {'tp' if p.tp > 1 else 'pp'} needs at least {2 * p.tp * p.pp} ranks "
                         f"(dp = {dims.world_size} / {p.tp * p.pp} = 1 here)")
    if p.data_parallel == "hsdp" and dims.dp // p.dp_replicate < 2:
        raise ValueError(f"hsdp needs at least {2 * p.dp_replicate} data-parallel ranks to shard within "
                         f"groups of >= 2 (dp={dims.dp}, parallel.dp_replicate={p.dp_replicate})")


def gather_rows(rows: list[dict]) -> list[list[dict]]:
    """Every rank's rows, in rank order (rare and small: pickling is fine)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [rows]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, rows)
    return out


def summarize(per_rank: list[list[dict]]) -> list[dict]:
    """One row per layout: the slowest rank's tokens/s and (rank 0's row: the trainer gathers
    them there) the largest rank's memory."""
    rows = []
    for same_layout in zip(*per_rank):
        row = dict(same_layout[0])
        if row["status"] != "skipped":
            row["tokens_per_s"] = min(r["tokens_per_s"] for r in same_layout)
        rows.append(row)
    return rows


def _ratio(x: float, ref: float) -> float:
    return x / ref if ref > 0 else math.nan


def print_table(rows: list[dict], *, world: int, overrides: list[str]) -> None:
    ran = [r for r in rows if r["status"] != "skipped"]
    if ran:
        ref = ran[0]  # the first layout, or the first that ran when it was skipped
        gpu = ref["device"] == "cuda"
        shown = {o.split("=", 1)[0]: o for o in overrides}  # the value that wins for each key
        _line(f"parallel bench on {ref['device_name']} x{world}: {' '.join(shown.values())}")
        _line("tokens/s: median per step after the first, slowest rank")
        _line("GB:       params, grads and optimizer state at the last step (local shards) and the peak "
              f"after warm-up ({ref['memory_source']}); each the largest rank's")
        _line("memory:   " + ("the peak" if gpu else "params + grads + optimizer state (the CPU peak "
                              "includes the interpreter and torch)") + f", as a ratio to {ref['layout']}")
        vs = f"vs {ref['layout']}"
        _line(f"{'layout':<9} {'tokens/s':>10} {vs:>8} {'params':>8} {'grads':>8} {'optim':>8} "
              f"{'peak':>8} {'memory':>8}  status")
        for r in ran:
            r["speedup"] = _ratio(r["tokens_per_s"], ref["tokens_per_s"])
            r["memory"] = _ratio(r["memory_gb"], ref["memory_gb"])
    else:
        _line(f"parallel bench x{world}: every layout was skipped")
    for r in rows:
        if r["status"] == "skipped":
            _line(f"{r['layout']:<9} {'-':>10} {'-':>8} {'-':>8} {'-':>8} {'-':>8} {'-':>8} {'-':>8}  "
                  f"skipped: {r['reason']}")
        else:
            gb = " ".join(f"{r[k]:>8.4g}" for k in MEMORY_COLUMNS)
            _line(f"{r['layout']:<9} {r['tokens_per_s']:>10,.0f} {r['speedup']:>7.2f}x {gb} "
                  f"{r['memory']:>7.2f}x  {r['status']}")
    for r in rows:  # last: one line per layout
        if r["status"] == "skipped":
            _line(f"layout {r['layout']}: skipped: {r['reason']}")
        else:
            _line(f"layout {r['layout']}: speedup: {r['speedup']:.2f}x  memory: {r['memory']:.2f}x")


def _line(text: str) -> None:
    """One line on rank 0, never wrapped by rich (reasons are long) nor read as markup."""
    print0(text, soft_wrap=True, markup=False)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="trainlab bench parallel", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", default=DEFAULT_LAYOUTS,
                    help=f"comma-separated conf/parallel options, the first is the reference "
                         f"(default {DEFAULT_LAYOUTS})")
    ap.add_argument("overrides", nargs="*", default=[],
                    help="Hydra overrides of the trial (default: model=small train.max_steps=20)")
    args = ap.parse_args(argv)
    layouts = [name for name in args.layouts.split(",") if name]
    unknown = [name for name in layouts if not (CONF_DIR / "parallel" / f"{name}.yaml").is_file()]
    if unknown or not layouts:
        known = sorted(p.stem for p in (CONF_DIR / "parallel").glob("*.yaml"))
        ap.error(f"unknown layout(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(known)}")
    overrides = ["model=small", "train.max_steps=20", *args.overrides]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rows = summarize(gather_rows([run_layout(overrides, layout, world) for layout in layouts]))
    print_table(rows, world=world, overrides=overrides)
    close_distributed()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
