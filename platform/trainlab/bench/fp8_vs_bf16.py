"""FP8 against BF16: the engine on the same model, seed and tokens, one precision after another.

    torchrun --nproc-per-node 1 -m trainlab.bench.fp8_vs_bf16 model=1b train.compile=true
    trainlab bench fp8 --matmul                 # where FP8 matmuls start to pay off

Each precision trains the same steps on the same batches in this process (or in each
torchrun process), then validates. Prints tokens/s, model TFLOP/s, MFU against the peak of
the high-precision dtype (precision.hp_dtype, bf16 by default) and against the FP8 peak
where the device's is known, validation loss; then one line per FP8 mode with
`speedup: X.XXx` (tokens/s over the first precision's) and `val loss gap: +Y.YY%`.
A mode is a precision name, or `fp32+tf32` (fp32 with precision.tf32=true). --json writes
the rows after each mode (peak memory, how many linears ran in FP8, a sha256 of every batch the
mode trained and validated on, build / first-step / steady-step seconds) for a driver such as
trainlab.bench.acceptance.gpu_accept. Modes after the first run as a warm gang's trials do
(engine.isolation.GangState puts the process back after each).
--matmul times bare matmuls instead (bf16 torch.mm against torch._scaled_mm with
tensorwise scales) over square sizes, printing the speedup per size: the crossover.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import statistics
import time

import torch

from trainlab import names
from trainlab.config import compose_run_config
from trainlab.console import print0
from trainlab.devices import resolve_device
from trainlab.distributed import device_name, setup_distributed
from trainlab.engine.isolation import GangState
from trainlab.engine.run import build_trainer
from trainlab.plan.derive_layout import plan_layout
from trainlab.plan.trial_plan import Where, plan_trial
from trainlab.precision.capability import cpu_lacks_native
from trainlab.vocab.precision import emulates, spec_of

DEFAULT_PRECISIONS = "bf16,fp8_tensorwise,fp8_rowwise"


def mode_overrides(mode: str) -> list[str]:
    """The overrides of a mode: a precision name, or `fp32+tf32` (fp32 on TF32 tensor cores)."""
    name, _, variant = mode.partition("+")
    if variant not in ("", "tf32") or (variant and name != "fp32"):
        raise ValueError(f"--precisions entry {mode!r} is not a mode; write a precision name "
                         "(e.g. bf16) or fp32+tf32")
    return [f"precision={name}", *(["precision.tf32=true"] if variant else [])]


def run_precision(overrides: list[str], precision: str, world: int) -> dict:
    t0 = time.perf_counter()
    mode = [*overrides, *mode_overrides(precision), f"cluster.num_workers={world}"]
    run = compose_run_config(mode)
    dist_info = setup_distributed(run.cluster.device)
    emulated_here = False
    if dist_info.device.type == "cpu":
        torch.set_num_threads(run.cluster.cpus_per_worker)
        # what the engine would refuse natively here (torch 2.11): the same casts, matmuls in
        # hp_dtype, so the plumbing still runs
        if cpu_lacks_native(run.precision.name, emulated=emulates(run.precision, device_type="cpu")):
            run = compose_run_config([*mode, "precision.fp8_impl=emulated"])
            emulated_here = True
            print0(f"{precision}: emulated (precision.fp8_impl=emulated): torch {torch.__version__}'s CPU "
                   "_scaled_mm has no rowwise scales")
    else:
        # each mode's own peak, not the largest of the modes this process ran before it (the
        # last mode's trainer sits in reference cycles until a collection frees it)
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dist_info.device)
    trainer = build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info)
    build_s = time.perf_counter() - t0
    tokens = watch_tokens(trainer)
    marks: list[float] = []
    trainer.add_hook(lambda tr, step, metrics: marks.append(time.perf_counter()), every=1)
    t_train = time.perf_counter()
    result = trainer.train()
    compiled = trainer.run.train.compile == "true"  # as build_trainer resolved train.compile=auto
    plan = trainer.recipe.plan
    row = {"precision": precision, "tokens_per_s": result.tokens_per_s, "mfu": result.mfu,
           "mfu_fp8": result.mfu_fp8, "val_loss": result.final_val_loss,
           "status": result.status, "tflops": result.tokens_per_s * trainer.throughput.flops_per_token / 1e12,
           "device": device_name(dist_info.device), "steps": result.steps, "tokens_seen": result.tokens_seen,
           "data_sha256": tokens.hexdigest(),
           "peak_mem_gb": result.peak_mem_gb, "elapsed_s": result.elapsed_s, "model": run.model.name,
           "compile": compiled, "compile_unit": trainer.run.train.compile_unit if compiled else "",
           "fp8_impl": "emulated: this CPU's torch._scaled_mm has no rowwise scales" if emulated_here else "",
           # the engine's fp8_layers tag: linears in FP8 / all linears (None: not an FP8 mode)
           names.TAG_FP8_LAYERS: plan.summary if plan is not None and spec_of(run.precision.name).fp8 else None,
           "mfu_peak": trainer.throughput.peak.source, "build_s": build_s,
           **step_timing(t_train, marks)}
    row.update(_estimated(run, device=dist_info.device.type))
    del trainer
    row["mode_s"] = time.perf_counter() - t0
    return row


def watch_tokens(trainer) -> "hashlib._Hash":
    """A sha256 that takes in the validation batches now and every training micro-batch as
    the trainer draws it: equal digests, equal tokens in the same order."""
    digest = hashlib.sha256()

    def take(batches):
        for x, y in batches:
            digest.update(x.detach().cpu().numpy().tobytes())
            digest.update(y.detach().cpu().numpy().tobytes())
        return batches

    take(trainer.val)
    draw = trainer.batches.next_step
    trainer.batches.next_step = lambda: take(draw())  # CPU tensors, ~64 KB a step: no device sync
    return digest


def step_timing(start: float, marks: list[float]) -> dict:
    """From the times each step ended (`marks`, the last one after validation): the first
    step, the median of the steps between (steady), and what the first and the last took
    beyond a steady step: compile_s (torch.compile of the training graph, with the first
    step's allocations and kernel choices) and eval_s (validation, with its own compile)."""
    spans = [b - a for a, b in zip([start, *marks], marks)]
    if len(spans) < 3:
        return {"first_step_s": spans[0] if spans else None, "step_s": None, "compile_s": None, "eval_s": None}
    steady = statistics.median(spans[1:-1])
    return {"first_step_s": spans[0], "step_s": steady, "compile_s": max(0.0, spans[0] - steady),
            "eval_s": max(0.0, spans[-1] - steady)}


def _estimated(run, *, device: str) -> dict:
    """What trainlab.estimate said of this mode on this gang before it ran (est_tokens_per_s,
    est_peak_mem_gb, est_bound), beside what it measured; {} where it cannot say."""
    from trainlab.estimate.fit_check import estimate_run, torchrun_cluster

    try:
        est = estimate_run(run, torchrun_cluster(run, device=device), trial_layout=plan_layout(run))
    except (ValueError, NotImplementedError):
        return {}
    return {"est_tokens_per_s": est.tokens_per_s, "est_peak_mem_gb": est.peak_mem_gb, "est_bound": est.bound}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def matmul_crossover(sizes: list[int], *, device: str, repeats: int = 20) -> None:
    """bf16 mm against FP8 _scaled_mm (e4m3 x e4m3, tensorwise scales, bf16 out) per size."""
    dev = torch.device(device)
    print0(f"matmul crossover on {device_name(dev)} (M=N=K, median of {repeats})")
    print0(f"{'size':>7} {'bf16 TFLOP/s':>13} {'fp8 TFLOP/s':>12} {'speedup':>8}")
    one = torch.ones((), device=dev)
    for n in sizes:
        a = torch.randn(n, n, device=dev).to(torch.bfloat16)
        b = torch.randn(n, n, device=dev).to(torch.bfloat16)
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()  # column-major, as _scaled_mm wants
        t_bf16 = _time(lambda a=a, b=b: torch.mm(a, b), dev, repeats)
        t_fp8 = _time(lambda a8=a8, b8=b8: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one,
                                                            out_dtype=torch.bfloat16), dev, repeats)
        flops = 2 * n**3
        print0(f"{n:>7} {flops / t_bf16 / 1e12:>13.1f} {flops / t_fp8 / 1e12:>12.1f} {t_bf16 / t_fp8:>7.2f}x")


def _time(fn, dev: torch.device, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="trainlab bench fp8", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precisions", default=DEFAULT_PRECISIONS,
                    help=f"comma-separated, the first is the reference (default {DEFAULT_PRECISIONS})")
    ap.add_argument("--matmul", action="store_true", help="time bare matmuls over sizes instead")
    ap.add_argument("--sizes", default="256,512,1024,2048,4096,8192", help="--matmul sizes")
    ap.add_argument("--json", default="", help="also write the rows to this file (rank 0), after each mode")
    ap.add_argument("--keep-going", action="store_true",
                    help="a mode that raises gets an error row and the next mode runs (one process only)")
    ap.add_argument("overrides", nargs="*", default=[],
                    help="Hydra overrides of the trial (default: model=small train.max_steps=40)")
    args = ap.parse_args(argv)
    if args.matmul:
        matmul_crossover([int(s) for s in args.sizes.split(",")],
                         device=resolve_device("auto", gpus=torch.cuda.is_available()))
        return
    overrides = ["model=small", "train.max_steps=40", "train.eval_every=0", "tracking=none",
                 *args.overrides]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    modes = args.precisions.split(",")
    for mode in modes:
        mode_overrides(mode)  # a typo fails before the first mode trains
    if args.keep_going and world > 1:
        ap.error("--keep-going runs in one process only: a rank that carries on alone would hang its peers")
    rows = []
    state = GangState.capture()  # each mode starts as in a fresh process (engine.isolation)
    for mode in modes:
        t0 = time.perf_counter()
        try:
            rows.append(run_precision(overrides, mode, world))
        except Exception as e:
            if not args.keep_going:
                raise
            print0(f"{mode} failed: {type(e).__name__}: {e}")
            rows.append({"precision": mode, "status": f"error: {type(e).__name__}: {str(e)[:300]}",
                         "mode_s": time.perf_counter() - t0})
        if args.json and int(os.environ.get("RANK", "0")) == 0:  # after each mode: a crash keeps the rest
            # whole or not at all: a driver reads it while this process runs
            with open(f"{args.json}.part", "w") as f:
                json.dump({"overrides": overrides, "world_size": world, "rows": rows}, f, indent=1)
            os.replace(f"{args.json}.part", args.json)
        # dynamo's compiled code, torch flags (fp32+tf32's TF32), RNG, memory: back to capture
        state.after_trial(barrier=world > 1 and "tokens_per_s" in rows[-1])
    done = [r for r in rows if "tokens_per_s" in r]
    print0(f"fp8 bench on {done[0]['device'] if done else '?'} x{world}: {' '.join(overrides)}")
    print0(f"{'precision':<20} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU hp peak':>14} "
           f"{'MFU fp8 peak':>13} {'val loss':>9} {'peak GB':>8}  status")
    for r in rows:
        if r not in done:
            print0(f"{r['precision']:<20} {r['status']}")
            continue
        print0(f"{r['precision']:<20} {r['tokens_per_s']:>10,.0f} {r['tflops']:>8.3g} {_pct(r['mfu']):>14} "
               f"{_pct(r['mfu_fp8']):>13} {r['val_loss']:>9.4f} {r['peak_mem_gb']:>8.2f}  {r['status']}")
    ref = rows[0]
    for r in done if ref in done else []:
        if r is ref:
            continue
        gap = (r["val_loss"] - ref["val_loss"]) / ref["val_loss"]
        print0(f"{r['precision']} vs {ref['precision']}: speedup: {r['tokens_per_s'] / ref['tokens_per_s']:.2f}x"
               f"   val loss gap: {100 * gap:+.2f}%")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
