"""Engine overhead: the Trainer (all telemetry, MLflow tracking on; with tracking=none the
JSONL tracker, for machines without MLflow) against a bare PyTorch loop.

Both train the same model from the same init on the same batches in this process (or in
each torchrun process), alternating engine / bare for --repeats rounds so drift on a shared
machine hits both alike. Prints each round, the medians, and last `ratio: X.XXX` =
engine tokens/s / bare tokens/s (1.0 = no overhead).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from trainlab.config import compose_run_config, parallel_dims
from trainlab.console import print0
from trainlab.data import TokenBatches
from trainlab.engine.distributed import setup_distributed
from trainlab.engine.run import build_trainer, seed_everything
from trainlab.engine.schedule import build_optimizer
from trainlab.models import build_model
from trainlab.parallel import no_sync, parallelize
from trainlab.precision import build_recipe
from trainlab.tracking import JsonlTracker


def bare_loop(run, dist_info, *, vocab_size: int, train_tokens) -> float:
    """The same training as the engine with nothing around it; returns tokens/s."""
    seed_everything(run.seed)
    model = build_model(run.model, vocab_size=vocab_size).to(dist_info.device)
    recipe = build_recipe(run.precision, device_type=dist_info.device.type)
    model = recipe.prepare(model)
    layout = parallelize(model, dims=parallel_dims(run), cfg=run.parallel, device=dist_info.device)
    model = layout.model
    optimizer, scheduler = build_optimizer(model, run.optim, max_steps=run.train.max_steps,
                                           make_optimizer=layout.make_optimizer,
                                           bf16_update=run.precision.bf16_update, seed=run.seed)
    t = run.train
    batches = TokenBatches(train_tokens, seq_len=t.seq_len, global_batch_size=t.global_batch_size,
                           micro_batch_size=t.micro_batch_size, dp_rank=dist_info.rank,
                           dp_size=dist_info.world_size, seed=run.seed)
    t0 = time.perf_counter()
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
    return batches.tokens_per_step * t.max_steps / (time.perf_counter() - t0)


def engine_loop(run, dist_info, *, tracking_dir: str) -> float:
    """The Trainer with every telemetry hook on and its tracker: MLflow (a store in
    `tracking_dir`, system metrics as configured) or, with tracking=none, the JSONL file
    there (where MLflow is not installed, as on the GPU machines)."""
    tracker = None
    if dist_info.is_rank0 and run.tracking.name == "mlflow":
        from trainlab.tracking.runs import start_trial_tracking

        tracker = start_trial_tracking(run, tracking_uri=f"sqlite:///{tracking_dir}/bench.db")[1]
    elif dist_info.is_rank0:
        tracker = JsonlTracker(os.path.join(tracking_dir, "metrics.jsonl"))
    trainer = build_trainer(run, dist_info, tracker=tracker)
    trainer.add_hook(lambda tr, step, metrics: None, every=1)  # a progress consumer, as in a real run
    t0 = time.perf_counter()
    result = trainer.train()
    if tracker is not None:
        tracker.close()  # the final flush is part of the engine's cost
    return result.tokens_seen / (time.perf_counter() - t0)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="trainlab bench overhead", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="rounds of engine/bare (default 3)")
    ap.add_argument("overrides", nargs="*", default=[],
                    help="Hydra overrides of the trial (default: model=small train.max_steps=60)")
    args = ap.parse_args(argv)
    overrides = ["model=small", "train.max_steps=60", "train.eval_batches=1", "train.eval_every=0",
                 *args.overrides]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    run = compose_run_config([*overrides, f"cluster.num_workers={world}"])
    dist_info = setup_distributed(run.cluster.device)
    if dist_info.device.type == "cpu":
        torch.set_num_threads(run.cluster.cpus_per_worker)
    from trainlab.data import build_corpus

    corpus = build_corpus(run.data)
    print0(f"overhead: model={run.model.name} precision={run.precision.name} world={dist_info.world_size} "
           f"steps={run.train.max_steps} batch={run.train.global_batch_size}x{run.train.seq_len} "
           f"device={dist_info.device} tracking={run.tracking.name}")
    engine_rates, bare_rates = [], []
    with tempfile.TemporaryDirectory() as tmp:
        engine_loop(run, dist_info, tracking_dir=tmp)  # warm-up round: store creation, kernels
        for i in range(args.repeats):
            engine_rates.append(engine_loop(run, dist_info, tracking_dir=tmp))
            bare_rates.append(bare_loop(run, dist_info, vocab_size=corpus.vocab_size,
                                        train_tokens=corpus.train))
            print0(f"round {i + 1}: engine {engine_rates[-1]:,.0f} tok/s   bare {bare_rates[-1]:,.0f} tok/s")
    e, b = statistics.median(engine_rates), statistics.median(bare_rates)
    print0(f"median: engine {e:,.0f} tok/s   bare {b:,.0f} tok/s")
    print0(f"ratio: {e / b:.3f}")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
