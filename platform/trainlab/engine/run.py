"""One worker's whole trial: execute a TrialPlan (plan.trial_plan), train, report.

Called identically by a Ray Train worker (with the plan its driver made) and by a torchrun
process (which plans for itself, as it has no driver: plan_here). No Ray, no MLflow: the
caller hands in a tracker factory and a progress callback, which receives typed events.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import random
import socket
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from trainlab import names
from trainlab.config import RunConfig
from trainlab.config.checkpoints import Checkpoint, complete_checkpoints
from trainlab.config.export_target import export_folder
from trainlab.config.layout_types import coords, fsdp_shards
from trainlab.data import TokenBatches, build_corpus, val_batches
from trainlab.distributed import (
    DistInfo,
    backend_for,
    device_name,
    gather_strings,
    process_group_backend,
    setup_distributed,
)
from trainlab.engine.balance import DpBalancer
from trainlab.engine.checkpoint import Checkpointer, discard_after, rollback_of
from trainlab.engine.determinism import set_deterministic
from trainlab.engine.elastic import elastic_metrics, fit_to_gang, shrunk_note
from trainlab.engine.loss import token_loss
from trainlab.engine.resume import agreed_resume as agreed_intact_resume
from trainlab.engine.rollback import Rollback, attempt_config, rolls_back
from trainlab.engine.schedule import build_optimizer
from trainlab.engine.trainer import Trainer
from trainlab.estimate.record import estimate_metrics, estimate_tags, ratio_metrics
from trainlab.events import (
    EXPORTED,
    RESIZED,
    RESUMED,
    ROLLBACK,
    WARNING,
    Notice,
    Progress,
    ProgressEvent,
    StepDone,
    TrialResult,
    TrialStarted,
)
from trainlab.models import build_model
from trainlab.models.accounting import model_flops_per_token
from trainlab.models.init import materialize
from trainlab.parallel import parallelize, reshard
from trainlab.parallel.mesh import build_mesh
from trainlab.plan.derive_layout import unordered_reductions
from trainlab.plan.trial_plan import TrialPlan, replan
from trainlab.precision.capability import check_precision_on_gpu
from trainlab.precision.recipes import build_recipe
from trainlab.telemetry import Peak, Throughput, device_peak, inject_nan
from trainlab.telemetry.peak_flops import mean_peak
from trainlab.telemetry.peak_memory import memory_source
from trainlab.vocab.precision import spec_of
from trainlab.vocab.tracker import NullTracker, Tracker

TrackerFactory = Callable[[DistInfo, bool], Tracker]
"""(dist_info, resumed) -> rank 0's tracker; `resumed`: the trial goes on from a checkpoint in
the same run, so steps it replays must not be logged twice."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_trainer(plan: TrialPlan, dist_info: DistInfo, *, tracker: Tracker | None = None,
                  checkpointer: Checkpointer | None = None, rollback: Rollback | None = None,
                  restarts: int = 0) -> Trainer:
    """Corpus -> model -> precision recipe -> parallelize -> optimizer -> Trainer (see Trainer
    for `checkpointer`, `rollback` and `restarts`), as `plan` decided it: its degrees, pipeline
    micro-batches and stages and precision spec are read, never derived again here.
    debug.inject_nan is armed on a trial's first attempt only: a rollback's retry runs without
    it, as without debug.inject_fault."""
    run, dims = plan.run, plan.dims
    assert dims.world_size == dist_info.world_size, (
        f"config world size {dims.world_size} != process group size {dist_info.world_size}"
    )
    corpus = build_corpus(run.data)
    seed_everything(run.seed)
    with torch.device("meta"):  # shapes only: no rank ever holds the unsharded model (models.init)
        model = build_model(run.model, vocab_size=corpus.vocab_size)
    # model=custom without init_weights is built for real, from the seed above (models.custom)
    if not any(p.is_meta for p in model.parameters()):
        model.to(dist_info.device)
    model_flops = model_flops_per_token(run.model, model, vocab_size=corpus.vocab_size, seq_len=run.train.seq_len)
    if dist_info.device.type == "cuda":
        # again on the worker: preflight cannot see the GPUs of a remote cluster's workers
        check_precision_on_gpu(run.precision,
                               capability=torch.cuda.get_device_capability(dist_info.device),
                               device_name=device_name(dist_info.device))
    spec = plan.precision
    recipe = build_recipe(run.precision, device_type=dist_info.device.type,
                          fsdp_backend=backend_for(dist_info.device.type) if fsdp_shards(dims, run.parallel) else "")
    model = recipe.prepare(model)
    run = resolve_compile(run, unit=plan.compile_unit)  # decided by the plan for its device
    mesh = build_mesh(dims, device_type=dist_info.device.type, dp_replicate=run.parallel.dp_replicate) \
        if dist_info.world_size > 1 else None
    parallel = parallelize(model, dims=dims, cfg=run.parallel, device=dist_info.device, mesh=mesh,
                         param_dtype=spec.fsdp_param_dtype(run.precision.hp_dtype, emulated=recipe.emulated),
                         compile_unit=run.train.compile_unit if run.train.compile == "true" else None,
                         deterministic=run.train.deterministic, loss_fn=_loss,
                         pp_microbatches=plan.pp_microbatches, pp_virtual_stages=plan.pp_virtual_stages,
                         tp_plan=run.model.tp_plan)
    model = parallel.model
    # this rank's part of the layout gets storage and the one-process model's values
    materialize(model, device=dist_info.device, seed=run.seed)
    if run.model.pretrained:  # fine-tuning: each rank reads its own shards of the checkpoint
        from trainlab.models.hf_weights import load_pretrained

        load_pretrained(model, run.model.pretrained)
    recipe.attach(model, dp_group=parallel.dp_group)
    optimizer, scheduler = build_optimizer(model, run.optim, max_steps=run.train.max_steps,
                                           make_optimizer=parallel.make_optimizer,
                                           bf16_update=run.precision.bf16_update,  # bf16 params only
                                           seed=run.seed)

    t = run.train
    dp_rank = coords(dist_info.rank, dims).dp_rank  # tp and pp peers read the same batch
    batches = TokenBatches(corpus.train, seq_len=t.seq_len, global_batch_size=t.global_batch_size,
                           micro_batch_size=t.micro_batch_size, dp_rank=dp_rank, dp_size=dims.dp,
                           seed=run.seed, mask=corpus.train_mask)
    val = val_batches(corpus.val, seq_len=t.seq_len, micro_batch_size=t.micro_batch_size,
                      num_batches=max(1, t.eval_batches // dims.dp), dp_rank=dp_rank, dp_size=dims.dp,
                      mask=corpus.val_mask)
    throughput = Throughput(
        tokens_per_step=batches.tokens_per_step,
        flops_per_token=model_flops,
        peak=gang_peak(device_peak(dist_info.device, recipe.peak_dtype)),
        world_size=dist_info.world_size,
        fp8_peak=gang_peak(device_peak(dist_info.device, "fp8")) if spec.fp8 else None,
    )
    balancer = None
    if run.parallel.dp_balance != "equal" and dims.dp > 1:
        balancer = DpBalancer(mode=run.parallel.dp_balance, weights=run.parallel.dp_weights,
                              warmup=run.parallel.dp_balance_warmup, batches=batches,
                              device=dist_info.device)
    trainer = Trainer(model=model, optimizer=optimizer, scheduler=scheduler, recipe=recipe,
                      batches=batches, val=val, run=run, dist_info=dist_info,
                      throughput=throughput, tracker=tracker, corpus=corpus, pipeline=parallel.pipeline,
                      balancer=balancer, checkpointer=checkpointer, rollback=rollback, restarts=restarts)
    if run.debug.nan_injection is not None and not trainer.rollback.count:
        module, step = run.debug.nan_injection
        inject_nan(model, module, at_step=step, current_step=lambda: trainer.step + 1)
    return trainer


def resolve_compile(run: RunConfig, *, unit: str) -> RunConfig:
    """`run` with train.compile (auto included) resolved to what runs: true with its unit, or
    false; the trainer's run, so the `compile` tag says what ran."""
    train = dataclasses.replace(run.train, compile="true" if unit else "false",
                                compile_unit=unit or run.train.compile_unit)
    return dataclasses.replace(run, train=train)


def gang_peak(local: Peak) -> Peak:
    """Every rank's own peak combined (a collective): see peak_flops.mean_peak."""
    peaks = [Peak(*json.loads(p)) for p in gather_strings(json.dumps([local.flops_per_s, local.source]))]
    return mean_peak(peaks)


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A pipeline's last stage: one micro-batch's mean loss, as Trainer.forward_backward_step's."""
    return token_loss(logits, targets)


def export_model(trainer: Trainer, run: RunConfig, *, trial_hash: str) -> Path:
    """train.export=hf: the trained model as a save_pretrained folder in <output_dir>/hf_model (all
    ranks write their shards; models.hf_export), with data=hf's tokenizer."""
    from trainlab.models.hf_export import export_hf

    reshard(trainer.model)  # FSDP2 keeps the root gathered after the last evaluation
    return export_hf(trainer.model, cfg=run.model, out_dir=export_folder(run), trial_hash=trial_hash,
                     tokenizer=run.data.tokenizer if run.data.name == "hf" else "")


def run_trial(plan: TrialPlan, *, tracker_factory: TrackerFactory | None = None,
              progress: Progress | None = None, local_rank: int | None = None,
              where: tuple[str, str] | None = None) -> TrialResult:
    """Set up the process group, execute the plan, close the tracker; returns the same result on
    every rank. Its caller planned it (plan.trial_plan.plan_trial: the Ray driver, or
    plan.here.plan_here in this process); the engine never plans a trial itself.

    `where` is this worker's (node, device type) as the launcher knows it (Ray's node id and
    accelerator type); by default the host name and the device name.
    """
    run = plan.run
    estimate = plan.estimate  # the driver's (or plan_here's), logged beside what this trial measures
    set_deterministic(run.train.deterministic)  # before CUDA starts: cuBLAS reads its workspace env once
    dist_info = setup_distributed(plan.device, local_rank=local_rank)
    if dist_info.device.type == "cpu":
        torch.set_num_threads(run.cluster.cpus_per_worker)
    root = Path(plan.paths.checkpoint_root)
    trial_hash = plan.config_hash  # the trial's identity in its checkpoints, whatever it changes at run time
    trial_config = dict(plan.hashed_fields)  # its fields, so that a resume can name those that differ
    elastic = plan.gang.elastic  # as launched: Ray may have started the gang smaller
    plan = replan(plan, run=fit_to_gang(run, world_size=dist_info.world_size))  # an elastic gang's size
    run = plan.run
    resume_from = agreed_resume(run, root, trial_hash, trial_config=trial_config,
                                warn=_warner(progress) if dist_info.is_rank0 else None)
    resumed = resume_from is not None
    tracker = tracker_factory(dist_info, resumed) if tracker_factory and dist_info.is_rank0 else NullTracker()
    warn = progress if progress is not None and dist_info.is_rank0 else _print_event
    try:
        attempt = Attempt(plan, dist_info, tracker=tracker, root=root, trial_hash=trial_hash,
                          progress=progress,
                          first=resume_from, trial_config=trial_config)
        counted = str(count_start(root, resumed=resumed)) if dist_info.is_rank0 else ""
        restarts = int(gather_strings(counted)[0])  # rank 0 keeps the count
        trainer = attempt.start(resume_from, rollback_of(resume_from), restarts=restarts)
        tracker.log_metrics({names.RESTARTS: restarts, names.WORKERS: dist_info.world_size,
                             **elastic_metrics(elastic, plan), **estimate_metrics(estimate)}, step=trainer.step)
        if resumed:
            tracker.set_tags({names.TAG_RESUMED_FROM: str(resume_from.path)})
        corpus = trainer.corpus
        tracker.set_tags({
            names.TAG_DEVICE_NAME: device_name(dist_info.device),
            names.TAG_DEVICE_COUNT: dist_info.world_size,
            **hardware_tags(where or (socket.gethostname(), device_name(dist_info.device))),
            names.TAG_WORLD_SIZE: dist_info.world_size,
            names.TAG_DIST_BACKEND: process_group_backend(),
            names.TAG_CORPUS: corpus.name,
            names.TAG_CORPUS_FINGERPRINT: corpus.fingerprint,
            names.TAG_MFU_PEAK_SOURCE: trainer.throughput.peak.source,
            names.TAG_MEMORY_SOURCE: memory_source(dist_info.device),
            names.TAG_PRECISION_EMULATED: str(trainer.recipe.emulated).lower(),
            names.TAG_COMPILE: trainer.run.train.compile_unit if trainer.run.train.compile == "true" else "off",
            **_layer_tags(trainer.recipe),
            **estimate_tags(estimate),
        })
        layers = trainer.recipe.plan
        if spec_of(trainer.recipe.name).fp8 and layers is not None and not layers.lowp and dist_info.is_rank0:
            warn(Notice(WARNING, (
                f"precision={trainer.recipe.name} runs no FP8 layer: precision.keep_hp kept all {len(layers.hp)} "
                f"linears in high precision (tag {names.TAG_HP_LAYERS}), so this is not an FP8 trial; this "
                "model's linears are too small for this recipe's FP8 matmuls to pay (keep_hp 'small'): "
                "set precision.keep_hp=[output,unaligned] to study FP8 numerics on them anyway")))
        for note in unordered_reductions(run) if dist_info.is_rank0 else ():
            warn(Notice(WARNING, note))
        if not trainer.throughput.peak.flops_per_s and dist_info.is_rank0:
            warn(Notice(WARNING, f"no MFU for this run ({trainer.throughput.peak.source})"))
        if resumed and dist_info.is_rank0:
            warn(Notice(RESUMED, f"resumed from {resume_from.path} at step {trainer.step} "
                                 f"(restart {restarts}) on {dist_info.world_size} workers"))
        resized = shrunk_note(elastic, plan)
        if resized and dist_info.is_rank0:
            warn(Notice(RESIZED, resized))
        trainer, result = attempt.train(trainer, warn=warn if dist_info.is_rank0 else None)
        if run.train.export and result.status == names.STATUS_FINISHED:
            exported = export_model(trainer, run, trial_hash=trial_hash)
            tracker.log_artifact(str(exported))
            if dist_info.is_rank0:
                warn(Notice(EXPORTED, f"exported the trained model to {exported} (transformers' from_pretrained "
                                      "loads it)"))
        # the checksums: tags to find identical runs by, the norm a metric to say by how much
        tracker.set_tags({k: result.extra[k] for k in (names.TAG_PARAMS_SHA, names.TAG_LOSS_CURVE_SHA)})
        tracker.log_metrics({names.PARAM_NORM: result.extra[names.PARAM_NORM],
                             **ratio_metrics(estimate, peak_mem_gb=result.peak_mem_gb,
                                             tokens_per_s=result.tokens_per_s)}, step=result.steps)
        result.extra.update(corpus=corpus.name, unigram_entropy=corpus.unigram_entropy,
                            true_entropy=corpus.true_entropy, device=device_name(dist_info.device),
                            world_size=dist_info.world_size, rollbacks=trainer.rollback.history)
        return result
    finally:
        tracker.close()


class Attempt:
    """Builds the trainer of each attempt at a trial: the first (fresh or resumed from a
    checkpoint) and, with train.on_divergence=rollback, each retry after a divergence."""

    def __init__(self, plan: TrialPlan, dist_info: DistInfo, *, tracker: Tracker, root: Path,
                 trial_hash: str, progress: Progress | None, first: Checkpoint | None,
                 trial_config: dict | None = None):
        self.plan, self.run, self.dist_info, self.tracker = plan, plan.run, dist_info, tracker
        self.trial_config = trial_config
        """The hashed config fields as launched, written into every checkpoint's manifest."""
        self.first = first
        """The checkpoint the trial started from (None: step 0)."""
        self.root, self.trial_hash, self.progress = root, trial_hash, progress

    def start(self, ckpt: Checkpoint | None, rollback: Rollback, *, restarts: int) -> Trainer:
        """A trainer at `ckpt` (None: step 0) in the precision and learning rate of `rollback`;
        `restarts`: the trial's restarts from a checkpoint so far."""
        # the retry's precision (engine.rollback) re-planned, never derived here
        plan, dist_info = replan(self.plan, run=attempt_config(self.run, rollback)), self.dist_info
        run, dims = plan.run, plan.dims
        checkpointer = Checkpointer(
            self.root, keep=run.train.checkpoint_keep, rank=dist_info.rank, world_size=dist_info.world_size,
            config_hash=self.trial_hash, config=self.trial_config,
            shard_key=f"pp{coords(dist_info.rank, dims).pp_rank}" if dims.pp > 1 else "")
        trainer = build_trainer(plan, dist_info, tracker=self.tracker, checkpointer=checkpointer,
                                rollback=rollback, restarts=restarts)
        if ckpt is not None:
            checkpointer.load(trainer, ckpt)
        return trainer

    def train(self, trainer: Trainer, *, warn: Progress | None) -> tuple[Trainer, TrialResult]:
        """Train `trainer` to the end; with train.on_divergence=rollback a divergence is
        retried (see engine.rollback) until one attempt ends or the retries run out.
        Returns the last attempt's trainer and its result (timed over every attempt)."""
        self.announce(trainer)
        result = trainer.train()
        spent = 0.0  # the attempts' training time before the last
        while result.status == names.STATUS_DIVERGED and rolls_back(self.run, trainer.rollback):
            spent += result.elapsed_s
            rollback, restarts = trainer.rollback, trainer.restarts
            del trainer  # the diverged model and optimizer are freed before the retry's are built
            trainer = self.roll_back(rollback, restarts=restarts, diverged_at=result.steps)
            if warn is not None:
                warn(Notice(ROLLBACK, (
                    f"diverged at step {result.steps}: rolled back to step {trainer.step}, retry "
                    f"{trainer.rollback.count} of {self.run.train.max_rollbacks} "
                    f"({trainer.rollback.history.split('; ')[-1]})")))
            self.announce(trainer)
            result = trainer.train()
        result.rollbacks = trainer.rollback.count
        result.elapsed_s += spent
        return trainer, result

    def roll_back(self, rollback: Rollback, *, restarts: int, diverged_at: int) -> Trainer:
        """The attempt after one (whose state was `rollback`) diverged at step `diverged_at`:
        from the newest checkpoint (every one was saved at a finite step) or from step 0,
        recorded on the trial's run."""
        # a trial resumed from a checkpoint elsewhere (train.resume=PATH) can go back to that one too
        found = rollback.target(sorted([*complete_checkpoints(self.root), *filter(None, [self.first])],
                                       key=lambda c: c.step))
        ckpt = agreed_checkpoint(found)
        back_to = ckpt.step if ckpt else 0
        if self.dist_info.is_rank0:
            discard_after(self.root, back_to, config_hash=self.trial_hash)
        rollback = rollback.next(self.run, diverged_at=diverged_at, back_to=back_to)
        gc.collect()
        if self.dist_info.device.type == "cuda":
            torch.cuda.empty_cache()
        trainer = self.start(ckpt, rollback, restarts=restarts)
        self.tracker.log_metrics({names.ROLLBACKS: rollback.count}, step=trainer.step)
        self.tracker.set_tags({names.TAG_ROLLBACKS: rollback.history})
        return trainer

    def announce(self, trainer: Trainer) -> None:
        """Reference lines and progress events for the attempt about to train."""
        corpus, tracker, run = trainer.corpus, self.tracker, self.run
        refs = {names.REF_UNIGRAM_ENTROPY: corpus.unigram_entropy}
        if corpus.true_entropy is not None:
            refs[names.REF_TRUE_ENTROPY] = corpus.true_entropy
        # logged at step 0 and beside every val/loss point, so MLflow draws them as lines
        tracker.log_metrics(refs, step=0)
        trainer.add_hook(lambda tr, step, m: tracker.log_metrics(refs, step=step) if names.VAL_LOSS in m else None)
        if self.progress is not None and self.dist_info.is_rank0:
            self.progress(TrialStarted(step=trainer.step, max_steps=run.train.max_steps,
                                       device=device_name(self.dist_info.device),
                                       world_size=self.dist_info.world_size,
                                       unigram_entropy=corpus.unigram_entropy, true_entropy=corpus.true_entropy))
            trainer.add_hook(_progress_hook(self.progress))  # log steps and validations (the pruner's)


def agreed_resume(run: RunConfig, root: Path, trial_hash: str, *, trial_config: dict | None = None,
                  warn: Callable[[str], None] | None = None) -> Checkpoint | None:
    """The checkpoint train.resume points at, as rank 0 sees it (every rank loads the same one,
    even if a save landed between their looks), its files checked by every rank (a share
    each) against their digests at save; a collective (engine/resume.py)."""
    return agreed_intact_resume(run.train.resume, root, expect_hash=trial_hash, expect_config=trial_config,
                                warn=warn)


def _warner(progress: Progress | None) -> Callable[[str], None]:
    """A warning to the driver's console (a progress event), or printed under torchrun alone."""
    send = progress if progress is not None else _print_event
    return lambda message: send(Notice(WARNING, message))


def agreed_checkpoint(found: Checkpoint | None) -> Checkpoint | None:
    """Rank 0's `found` on every rank (a collective)."""
    chosen = gather_strings(json.dumps([str(found.path), found.step] if found else None))[0]
    if chosen == "null":
        return None
    path, step = json.loads(chosen)
    return Checkpoint(Path(path), step)


def count_start(root: Path, *, resumed: bool) -> int:
    """How many times this trial has restarted from a checkpoint (a file beside them)."""
    counter = root / "restarts"
    n = int(counter.read_text() or 0) if resumed and counter.is_file() else 0
    n = n + 1 if resumed else 0
    root.mkdir(parents=True, exist_ok=True)
    counter.write_text(str(n))
    return n


def hardware_tags(where: tuple[str, str]) -> dict[str, str | int]:
    """The device types (type:count) and the number of nodes the whole gang ran on; a
    collective: every rank calls it."""
    nodes, types = zip(*(w.split("\t", 1) for w in gather_strings("\t".join(where))))
    counts = Counter(types)
    return {names.TAG_DEVICE_TYPES: ",".join(f"{t}:{n}" for t, n in sorted(counts.items())),
            names.TAG_NODE_COUNT: len(set(nodes))}


def _layer_tags(recipe) -> dict[str, str]:
    """fp8 and emulated modes: how many linears run in low precision and which were kept."""
    if recipe.plan is None:
        return {}
    # MLflow tag values are limited to 5000 characters (a 7b model keeps few layers in hp)
    tags = {names.TAG_FP8_LAYERS: recipe.plan.summary, names.TAG_HP_LAYERS: recipe.plan.kept[:5000] or "-"}
    if recipe.all_gather is not None:
        tags[names.TAG_FP8_ALL_GATHER] = recipe.all_gather.tag
    return tags


def _print_event(event: ProgressEvent) -> None:
    if isinstance(event, Notice):
        print(f"{event.kind}: {event.message}", flush=True)


def _progress_hook(progress: Progress):
    """A step event at every step that logged its metrics (train.log_every, the last, a divergence)
    or validated: a sweep's pruner compares val losses at equal `tokens`, whatever log_every is."""
    def hook(trainer: Trainer, step: int, metrics: dict) -> None:
        if names.LOSS not in metrics and names.VAL_LOSS not in metrics:
            return
        progress(StepDone(step=step, max_steps=trainer.run.train.max_steps, loss=metrics.get(names.LOSS),
                          tokens_per_s=metrics.get(names.TOKENS_PER_S), val_loss=metrics.get(names.VAL_LOSS),
                          tokens=trainer.tokens_seen))
    return hook
