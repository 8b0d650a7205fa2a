"""trainlab against Hugging Face Accelerate: the same Hugging Face model trained by trainlab's
Trainer (model=hf model.pretrained=DIR) and by Accelerate's plain loop, the peer people pick
instead, side by side in one process.

The peer is the loop Accelerate's docs teach::

    accelerator = Accelerator(mixed_precision=..., gradient_accumulation_steps=...)
    model, optimizer, scheduler = accelerator.prepare(
        AutoModelForCausalLM.from_pretrained(DIR), AdamW(...), LambdaLR(...))
    for x, y in batches:
        with accelerator.accumulate(model):
            loss = cross_entropy(model(input_ids=x).logits, y)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(...); optimizer.step(); scheduler.step(); optimizer.zero_grad()

Like with like: both start from the folder's weights and see the same batches
(trainlab.data.TokenBatches, same seed), with trainlab's optim config in both (AdamW, weight
decay on matrices only, warmup then cosine, gradient clipping), the same precision (fp32, or
bf16 autocast with fp32 weights) and the same global and micro batch; neither compiles
(train.compile=false). Rounds alternate trainlab / accelerate (--repeats, after a warm-up round
of each, whose loss curves are compared) so drift on a shared machine hits both alike. Each
loop is timed from its first step to its end (trainlab's includes its end-of-run evaluation of
one batch and its tracker's last write). Prints each round, the loss curves side by side with
their largest difference, writes a plot of both (--plot), the `cpu ratio` = accelerate CPU
seconds / trainlab's for the same tokens (other work on a shared machine hardly moves it), and
last `ratio: X.XXX` = trainlab tokens/s / accelerate tokens/s (median of the rounds).

Without --model-dir it trains the demo model (models.hf_demo), written to a temporary folder,
so the bench runs on a fresh machine with nothing downloaded.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from trainlab.bench.side_by_side import Loop, engine_loop, run_stoppable
from trainlab.config import compose_run_config
from trainlab.console import print0
from trainlab.data import TokenBatches, build_corpus
from trainlab.distributed import setup_distributed
from trainlab.engine.run import seed_everything
from trainlab.engine.schedule import lr_factor

MIXED_PRECISION = {"fp32": "no", "bf16": "bf16"}
"""trainlab's precision -> Accelerate's mixed_precision that trains the same way."""
SAME_WITHIN = {"fp32": 1e-4, "bf16": 2e-2}
"""Largest relative loss difference at any step that still reads `same`. Both loops run the same
modules on the same weights and batches, so on CPU the curves come out identical; the room is
for kernels that order their sums differently (fp32: float rounding; bf16: its 8-bit mantissa)."""
OVERRIDABLE = ("data", "optim", "seed", "tracking", "cluster.cpus_per_worker", "train.numerics_every")
"""Overrides both loops follow (the peer reads the same corpus, optimizer settings, seed and thread
count), or that change only what trainlab records (its tracker, its numerics sampling), not what trains."""


def accelerate_loop(run, dist_info, *, model_dir: str, train_tokens, train_mask=None) -> Loop:
    """Accelerate's plain loop on transformers' own model, loaded from `model_dir`; `train_mask`:
    data=hf's masked targets (-100), which F.cross_entropy skips as transformers' loss does."""
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its per-load bars would interleave with the rounds
    seed_everything(run.seed)
    t, o = run.train, run.optim
    accum = t.global_batch_size // t.micro_batch_size
    accelerator = Accelerator(mixed_precision=MIXED_PRECISION[run.precision.name],
                              cpu=dist_info.device.type == "cpu", gradient_accumulation_steps=accum)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32,
                                                 attn_implementation="sdpa", trust_remote_code=False)
    model.config.use_cache = False
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": o.weight_decay},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, partial(
        lr_factor, warmup_steps=o.warmup_steps, max_steps=t.max_steps, min_lr_ratio=o.min_lr_ratio))
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    model.train()
    batches = TokenBatches(train_tokens, seq_len=t.seq_len, global_batch_size=t.global_batch_size,
                           micro_batch_size=t.micro_batch_size, dp_rank=0, dp_size=1, seed=run.seed,
                           mask=train_mask)
    losses = []
    t0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(t.max_steps):
        step_loss = torch.zeros((), device=accelerator.device)
        for x, y in batches.next_step():
            with accelerator.accumulate(model):
                logits = model(input_ids=x.to(accelerator.device)).logits
                loss = F.cross_entropy(logits.float().flatten(0, 1), y.to(accelerator.device).flatten())
                accelerator.backward(loss)  # divides by the accumulation steps
                step_loss += loss.detach()
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), o.grad_clip)
                optimizer.step()  # these three skip on all but the last micro-batch
                scheduler.step()
                optimizer.zero_grad()
        losses.append(step_loss.item() / accum)  # the loss a user's loop logs every step
    return Loop(batches.tokens_per_step * t.max_steps / (time.perf_counter() - t0),
                time.process_time() - cpu0, losses=losses)


def loss_table(ours: list[float], peer: list[float], *, tolerance: float) -> tuple[list[str], float]:
    """The loss curves side by side, a row per step; returns the rows (the last one the verdict)
    and the largest relative difference."""
    rows = [f"{'step':>5}  {'trainlab':>10}  {'accelerate':>10}  {'|diff|':>9}  {'relative':>9}"]
    worst, worst_step = 0.0, 0
    for step, (a, b) in enumerate(zip(ours, peer, strict=True), start=1):
        rel = abs(a - b) / max(abs(b), 1e-12) if math.isfinite(a) and math.isfinite(b) else math.inf
        if rel > worst or not math.isfinite(rel):
            worst, worst_step = rel, step
        rows.append(f"{step:>5}  {a:>10.6f}  {b:>10.6f}  {abs(a - b):>9.2e}  {rel:>9.2e}")
    where = f" at step {worst_step}" if worst_step else ""
    verdict = f"same (max relative difference {worst:.2e}{where}, within {tolerance:g})" if worst <= tolerance \
        else f"DIFFERENT (max relative difference {worst:.2e}{where}, above {tolerance:g})"
    rows.append(f"loss curves: {verdict}")
    return rows, worst


def write_plot(ours: list[float], peer: list[float], path: Path, *, title: str) -> None:
    """Both loss curves against the step, and their difference below."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 6), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax_loss, ax_diff = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    steps = range(1, len(ours) + 1)
    ax_loss.plot(steps, ours, label="trainlab", linewidth=2)
    ax_loss.plot(steps, peer, label="accelerate", linestyle="--")
    ax_loss.set(ylabel="train loss (nats)", title=title)
    ax_loss.legend()
    ax_diff.plot(steps, [a - b for a, b in zip(ours, peer)], color="tab:red")
    ax_diff.set(xlabel="step", ylabel="trainlab - accelerate")
    for ax in (ax_loss, ax_diff):
        ax.grid(True, alpha=0.3)
    fig.savefig(path)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="trainlab bench hf", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", default="", metavar="DIR",
                    help="a save_pretrained folder (llama/mistral/qwen2/qwen3); default: the demo model")
    ap.add_argument("--precision", default="fp32", choices=tuple(MIXED_PRECISION))
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per round (default 30)")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds of trainlab/accelerate (default 3)")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--global-batch-size", type=int, default=16, help="sequences per optimizer step")
    ap.add_argument("--micro-batch-size", type=int, default=8, help="sequences per forward")
    ap.add_argument("--demo-hidden", type=int, default=64,
                    help="the demo model's width (its MLP 3x that; default 64)")
    ap.add_argument("--demo-layers", type=int, default=2, help="the demo model's decoder layers (default 2)")
    ap.add_argument("--plot", default="bench_hf_loss.png", metavar="PNG",
                    help="where to write the loss curves' plot (default bench_hf_loss.png)")
    ap.add_argument("overrides", nargs="*", default=[],
                    help=f"Hydra overrides both loops follow, of {', '.join(OVERRIDABLE)} (e.g. optim.lr=3e-4)")
    args = ap.parse_args(argv)
    for name in ("steps", "repeats", "seq_len", "global_batch_size", "micro_batch_size",
                 "demo_hidden", "demo_layers"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    if args.model_dir and (args.demo_hidden != 64 or args.demo_layers != 2):
        ap.error(f"--demo-hidden/--demo-layers shape the demo model only; drop them with "
                 f"--model-dir={args.model_dir} (its config.json sets the shape)")
    for override in args.overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if not any(key == p or key.startswith(p + ".") for p in OVERRIDABLE):
            ap.error(f"override {override!r} would change trainlab's loop only: the peer follows "
                     f"{', '.join(OVERRIDABLE)}; use the bench's options for the rest (--help)")
    run_stoppable("hf", lambda: _bench(args))


def _bench(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir
        if not model_dir:
            from trainlab.models.hf_demo import write_demo_model

            vocab = build_corpus(compose_run_config(list(args.overrides)).data).vocab_size
            model_dir = str(write_demo_model(Path(tmp) / "demo", vocab_size=vocab, hidden_size=args.demo_hidden,
                                             intermediate_size=3 * args.demo_hidden,
                                             num_hidden_layers=args.demo_layers))
        run = compose_run_config([
            "model=hf", f"model.pretrained={model_dir}", f"precision={args.precision}",
            f"train.max_steps={args.steps}", f"train.seq_len={args.seq_len}",
            f"train.global_batch_size={args.global_batch_size}", f"train.micro_batch_size={args.micro_batch_size}",
            "train.eval_batches=1", "train.eval_every=0", "train.compile=false", "tracking=none",
            "cluster.num_workers=1", *args.overrides])
        _race(run, model_dir=model_dir, tmp=tmp, args=args)


def _race(run, *, model_dir: str, tmp: str, args: argparse.Namespace) -> None:
    dist_info = setup_distributed(run.cluster.device)
    if dist_info.device.type == "cpu":
        torch.set_num_threads(run.cluster.cpus_per_worker)
    corpus = build_corpus(run.data)
    t = run.train
    print0(f"hf: model={'demo ' if not args.model_dir else ''}{model_dir} ({run.model.n_layers} layers, "
           f"width {run.model.dim}) precision={run.precision.name} steps={t.max_steps} "
           f"batch={t.global_batch_size}x{t.seq_len} (micro {t.micro_batch_size}) device={dist_info.device} "
           f"threads={torch.get_num_threads()} tracking={run.tracking.name}")
    peer = partial(accelerate_loop, run, dist_info, model_dir=model_dir, train_tokens=corpus.train,
                   train_mask=corpus.train_mask)
    # warm-up rounds (kernels, allocator, file cache); their loss curves are the ones compared
    ours, theirs = engine_loop(run, dist_info, tracking_dir=tmp), peer()
    rounds = []
    for i in range(args.repeats):
        rounds.append((e := engine_loop(run, dist_info, tracking_dir=tmp), a := peer()))
        print0(f"round {i + 1}: trainlab {e.tokens_per_s:,.0f} tok/s   accelerate {a.tokens_per_s:,.0f} tok/s   "
               f"ratio {e.tokens_per_s / a.tokens_per_s:.3f}   CPU s: trainlab {e.cpu_s:.1f}, "
               f"accelerate {a.cpu_s:.1f}")
    rows, _ = loss_table(ours.losses, theirs.losses, tolerance=SAME_WITHIN[run.precision.name])
    for row in rows:
        print0(row)
    write_plot(ours.losses, theirs.losses, Path(args.plot),
               title=f"trainlab vs accelerate: {Path(model_dir).name}, {run.precision.name}, "
                     f"{t.global_batch_size}x{t.seq_len} tokens a step")
    print0(f"plot: {args.plot}")
    e_rate, a_rate = (statistics.median(r.tokens_per_s for r in rs) for rs in zip(*rounds))
    # the same tokens: CPU seconds hardly move with other work on the machine (tokens/s swing with it)
    cpu_ratio = statistics.median(a.cpu_s / e.cpu_s for e, a in rounds)
    print0(f"median: trainlab {e_rate:,.0f} tok/s   accelerate {a_rate:,.0f} tok/s   cpu ratio {cpu_ratio:.3f}")
    print0(f"ratio: {e_rate / a_rate:.3f}")
