"""FP8 against BF16: the engine on the same model, seed and tokens, one precision after another.

    torchrun --nproc-per-node 1 -m trainlab.bench.fp8 model=1b train.compile=true
    trainlab bench fp8 --matmul                 # where FP8 matmuls start to pay off

Each precision trains the same steps on the same batches in this process (or in each
torchrun process), then validates. Prints tokens/s, model TFLOP/s, MFU against the peak of
the high-precision dtype (precision.hp_dtype, bf16 by default) and against the FP8 peak
where the device's is known, validation loss; then one line per FP8 mode with
`speedup: X.XXx` (tokens/s over the first precision's) and `val loss gap: +Y.YY%`.
--matmul times bare matmuls instead (bf16 torch.mm against torch._scaled_mm with
tensorwise scales) over square sizes, printing the speedup per size: the crossover.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from trainlab.config import compose_run_config
from trainlab.console import print0
from trainlab.engine.distributed import device_name, setup_distributed
from trainlab.engine.run import build_trainer

DEFAULT_PRECISIONS = "bf16,fp8_tensorwise,fp8_rowwise"


def run_precision(overrides: list[str], precision: str, world: int) -> dict:
    run = compose_run_config([*overrides, f"precision={precision}", f"cluster.num_workers={world}"])
    dist_info = setup_distributed(run.cluster.device)
    if dist_info.device.type == "cpu":
        torch.set_num_threads(run.cluster.cpus_per_worker)
    trainer = build_trainer(run, dist_info)
    result = trainer.train()
    return {"precision": precision, "tokens_per_s": result.tokens_per_s, "mfu": result.mfu,
            "mfu_fp8": result.mfu_fp8, "val_loss": result.final_val_loss,
            "status": result.status, "tflops": result.tokens_per_s * trainer.throughput.flops_per_token / 1e12,
            "device": device_name(dist_info.device), "steps": result.steps}


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
    ap.add_argument("overrides", nargs="*", default=[],
                    help="Hydra overrides of the trial (default: model=small train.max_steps=40)")
    args = ap.parse_args(argv)
    if args.matmul:
        matmul_crossover([int(s) for s in args.sizes.split(",")],
                         device="cuda" if torch.cuda.is_available() else "cpu")
        return
    overrides = ["model=small", "train.max_steps=40", "train.eval_every=0", "tracking=none",
                 *args.overrides]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rows = [run_precision(overrides, p, world) for p in args.precisions.split(",")]
    print0(f"fp8 bench on {rows[0]['device']} x{world}: {' '.join(overrides)}")
    print0(f"{'precision':<20} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU hp peak':>14} "
           f"{'MFU fp8 peak':>13} {'val loss':>9}  status")
    for r in rows:
        print0(f"{r['precision']:<20} {r['tokens_per_s']:>10,.0f} {r['tflops']:>8.3g} {_pct(r['mfu']):>14} "
               f"{_pct(r['mfu_fp8']):>13} {r['val_loss']:>9.4f}  {r['status']}")
    ref = rows[0]
    for r in rows[1:]:
        gap = (r["val_loss"] - ref["val_loss"]) / ref["val_loss"]
        print0(f"{r['precision']} vs {ref['precision']}: speedup: {r['tokens_per_s'] / ref['tokens_per_s']:.2f}x"
               f"   val loss gap: {100 * gap:+.2f}%")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
