"""Engine overhead: the Trainer (all telemetry, MLflow tracking on; with tracking=none the
JSONL tracker, for machines without MLflow) against a bare PyTorch loop.

Both train the same model from the same init on the same batches in this process (or in
each torchrun process), alternating engine / bare for --repeats rounds so drift on a shared
machine hits both alike. Like with like: the bare loop compiles exactly where and what the
engine compiles (plan.derive_layout.compile_unit: train.compile=auto compiles on CUDA, not on
CPU), and each loop has a warm-up round first, so neither's ratio pays the other's compile. Prints each round, the medians, and last `ratio: X.XXX` =
engine tokens/s / bare tokens/s (1.0 = no overhead).

--load N runs N processes that spin on a core each beside both loops: the engine's helper
process (the MLflow writer with its system-metrics sampler) then competes with training for
CPU, as on a busy machine. Each round also prints the CPU seconds both loops and the writer
used and how long the engine waited for the writer's last delivery (part of the engine's
time); `cpu ratio` = bare CPU / (engine + writer CPU) for the same tokens, which other work
on the machine hardly moves (the tokens/s ratio swings with it).
SIGTERM or Ctrl-C stops the bench (exit 128 + signal, no ratio), whichever loop is running.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from trainlab.bench.side_by_side import Loop, engine_loop, run_stoppable
from trainlab.config import compose_run_config
from trainlab.console import print0
from trainlab.data import TokenBatches
from trainlab.distributed import setup_distributed
from trainlab.engine.run import seed_everything
from trainlab.engine.schedule import build_optimizer
from trainlab.models import build_model
from trainlab.parallel import no_sync, parallelize
from trainlab.plan.derive_layout import compile_unit, plan_layout
from trainlab.precision.recipes import build_recipe
from trainlab.vocab.precision import emulates

# exits on its own once its parent is gone (reparented), so a bench killed with SIGKILL
# leaves no spinning process behind; Ctrl-C (the whole process group) ends it silently
_SPIN = ("import os, signal\nsignal.signal(signal.SIGINT, signal.SIG_DFL)\nparent = os.getppid()\n"
         "while os.getppid() == parent:\n    sum(range(100_000))\n")


@contextlib.contextmanager
def busy_load(num_procs: int):
    """`num_procs` processes that keep a core each busy (at normal priority) while inside."""
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(num_procs)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def bare_loop(run, dist_info, *, vocab_size: int, train_tokens) -> Loop:
    """The same training as the engine with nothing around it."""
    seed_everything(run.seed)
    model = build_model(run.model, vocab_size=vocab_size).to(dist_info.device)
    recipe = build_recipe(run.precision, device_type=dist_info.device.type)
    model = recipe.prepare(model)
    unit = compile_unit(run, device_type=dist_info.device.type, emulated=recipe.emulated)
    layout = parallelize(model, dims=plan_layout(run).dims, cfg=run.parallel, device=dist_info.device,
                         compile_unit=unit or None, deterministic=run.train.deterministic)
    model = layout.model
    optimizer, scheduler = build_optimizer(model, run.optim, max_steps=run.train.max_steps,
                                           make_optimizer=layout.make_optimizer,
                                           bf16_update=run.precision.bf16_update, seed=run.seed)
    t = run.train
    batches = TokenBatches(train_tokens, seq_len=t.seq_len, global_batch_size=t.global_batch_size,
                           micro_batch_size=t.micro_batch_size, dp_rank=dist_info.rank,
                           dp_size=dist_info.world_size, seed=run.seed)
    t0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(t.max_steps):
        optimizer.zero_grad(set_to_none=True)
        micro = batches.next_step()
        for i, (x, y) in enumerate(micro):
            with no_sync(model, last_micro_batch=i == len(micro) - 1):
                with recipe.autocast():
                    logits = model(x.to(dist_info.device))
                loss = F.cross_entropy(logits.float().flatten(0, 1), y.to(dist_info.device).flatten())
                recipe.scale(loss / len(micro)).backward()
        recipe.unscale(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), run.optim.grad_clip)
        recipe.step(optimizer, grads_finite=True)
        scheduler.step()
    if dist_info.device.type == "cuda":
        torch.cuda.synchronize()
    return Loop(batches.tokens_per_step * t.max_steps / (time.perf_counter() - t0), time.process_time() - cpu0)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="trainlab bench overhead", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="rounds of engine/bare (default 3)")
    ap.add_argument("--load", type=int, default=0, metavar="N",
                    help="N busy processes beside both loops, a machine other work keeps busy (default 0)")
    ap.add_argument("overrides", nargs="*", default=[],
                    help="Hydra overrides of the trial (default: model=small train.max_steps=60)")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.load < 0:
        ap.error(f"--repeats={args.repeats} must be >= 1 and --load={args.load} >= 0")
    run_stoppable("overhead", lambda: _bench(args))


def _bench(args: argparse.Namespace) -> None:
    overrides = ["model=small", "train.max_steps=60", "train.eval_batches=1", "train.eval_every=0",
                 *args.overrides]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    run = compose_run_config([*overrides, f"cluster.num_workers={world}"])
    dist_info = setup_distributed(run.cluster.device)
    if dist_info.device.type == "cpu":
        torch.set_num_threads(run.cluster.cpus_per_worker)
    from trainlab.data import build_corpus

    corpus = build_corpus(run.data)
    unit = compile_unit(run, device_type=dist_info.device.type,
                        emulated=emulates(run.precision, device_type=dist_info.device.type))
    print0(f"overhead: model={run.model.name} precision={run.precision.name} world={dist_info.world_size} "
           f"steps={run.train.max_steps} batch={run.train.global_batch_size}x{run.train.seq_len} "
           f"device={dist_info.device} tracking={run.tracking.name} load={args.load} "
           f"compile={unit or 'off'} (both loops)")
    engines, bares = [], []
    with tempfile.TemporaryDirectory() as tmp, busy_load(args.load):
        # warm-up rounds: store creation, kernels, and (compiled) each loop's graphs
        engine_loop(run, dist_info, tracking_dir=tmp)
        bare_loop(run, dist_info, vocab_size=corpus.vocab_size, train_tokens=corpus.train)
        for i in range(args.repeats):
            engines.append(e := engine_loop(run, dist_info, tracking_dir=tmp))
            bares.append(b := bare_loop(run, dist_info, vocab_size=corpus.vocab_size, train_tokens=corpus.train))
            print0(f"round {i + 1}: engine {e.tokens_per_s:,.0f} tok/s   bare {b.tokens_per_s:,.0f} tok/s   "
                   f"ratio {e.tokens_per_s / b.tokens_per_s:.3f}   CPU s: engine {e.cpu_s:.1f} + writer "
                   f"{e.writer_cpu_s:.1f}, bare {b.cpu_s:.1f}   writer waited for {e.close_s:.1f} s")
    e_rate, b_rate = (statistics.median(r.tokens_per_s for r in rs) for rs in (engines, bares))
    cpu_ratio = statistics.median(b.cpu_s / (e.cpu_s + e.writer_cpu_s) for e, b in zip(engines, bares))
    print0(f"median: engine {e_rate:,.0f} tok/s   bare {b_rate:,.0f} tok/s   cpu ratio {cpu_ratio:.3f}")
    print0(f"ratio: {e_rate / b_rate:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
