"""The training loop, in three levels (as torchtitan splits it):

forward_backward_step  one micro-batch: forward under the precision recipe, scaled backward
train_step             one optimizer step: accumulation, unscale, clip, step, LR, counters
train                  the loop: metrics, validation, hooks, early stop on divergence

Stability telemetry rides along: a step whose loss or gradient is non-finite is replayed
forward to name the tensor that went first (healthy steps pay nothing for it); every
train.numerics_every steps one step is sampled: the casts of every low-precision layer,
SwiGLU outliers, the update-to-weight ratio and the grad-norm percentiles.

Unequal data-parallel shares (parallel.dp_balance, engine.balance) weight each micro-batch's
loss by its share of the global batch; debug.slowdown (engine.slowdown) emulates slow ranks.

The Trainer knows nothing of Ray or MLflow: it logs through a Tracker and calls hooks.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from trainlab import names
from trainlab.config.schema import RunConfig
from trainlab.data import Corpus
from trainlab.data.batches import IGNORE_INDEX
from trainlab.data.shares import loss_weight
from trainlab.distributed import DistInfo, all_reduce_mean, gather_strings, mean_over_ranks
from trainlab.engine.balance import DpBalancer
from trainlab.engine.checkpoint import Checkpointer
from trainlab.engine.loss import token_loss
from trainlab.engine.preemption import PREEMPT, Preemption
from trainlab.engine.rollback import Rollback, scale_lr
from trainlab.engine.slowdown import Slowdown
from trainlab.engine.state import (
    load_sharded_state,
    load_zero1_state,
    rng_state,
    set_rng_state,
    sharded_state,
    zero1_state,
)
from trainlab.events import TrialResult
from trainlab.parallel import no_sync, reshard, unwrap
from trainlab.parallel.ddp import allreduce_grads
from trainlab.parallel.tp import clip_grads_with_norm_
from trainlab.precision.recipes import PrecisionRecipe
from trainlab.telemetry import (
    GradNormWindow,
    NonFiniteMonitor,
    NumericsProbe,
    SpikeDetector,
    StabilityCounters,
    Throughput,
    UpdateMeter,
)
from trainlab.telemetry.checksum import loss_curve_sha256, params_checksum
from trainlab.telemetry.nonfinite import ACTIVATION, LOSS
from trainlab.telemetry.peak_memory import memory_gb, peak_memory_gb, reset_peak_memory
from trainlab.telemetry.ranks import RankTimer, gather_rank_metrics, memory_metrics, timed_collectives
from trainlab.telemetry.stages import gather_over_stages
from trainlab.telemetry.swiglu import SwigluMonitor, w13_alignment
from trainlab.vocab.tracker import NullTracker, Tracker

Batch = tuple[torch.Tensor, torch.Tensor]
Hook = Callable[["Trainer", int, dict], None]


@dataclass
class StepResult:
    loss: float
    """Mean loss of the step's global batch (all ranks)."""
    grad_norm: float
    """Global gradient norm before clipping (inf/NaN if gradients overflowed)."""
    applied: bool
    """False when the update was skipped (non-finite gradients, loss-scale overflow)."""
    origin: str = ""
    """When loss or gradients were non-finite: the tensor that went first (any rank)."""
    numerics: dict = field(default_factory=dict)
    """Sampled steps only: cast statistics, SwiGLU outliers, update-to-weight ratio."""

    @property
    def finite(self) -> bool:
        return math.isfinite(self.loss) and math.isfinite(self.grad_norm)


class Trainer:
    def __init__(self, *, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler,
                 recipe: PrecisionRecipe, batches, val: list[Batch], run: RunConfig,
                 dist_info: DistInfo, throughput: Throughput, tracker: Tracker | None = None,
                 corpus: Corpus | None = None, pipeline=None, balancer: DpBalancer | None = None,
                 checkpointer: Checkpointer | None = None, rollback: Rollback | None = None,
                 restarts: int = 0):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.recipe, self.batches, self.val = recipe, batches, val
        self.run, self.dist = run, dist_info
        self.throughput = throughput
        self.corpus = corpus
        """The corpus it trains on (for reference lines and tags); the loop itself reads `batches`."""
        self.pipeline = pipeline
        """parallel.pp > 1: this rank's stages and their schedule (`model` is then the stages)."""
        self.balancer = balancer
        """parallel.dp_balance weighted / accumulate: fixes the uneven shares of `batches`."""
        self.tracker: Tracker = tracker if tracker is not None and dist_info.is_rank0 else NullTracker()
        self.step = 0
        self._warmup_step = 1
        """The first step of this attempt (train() sets it): its memory peak is logged apart."""
        self.tokens_seen = 0
        self.counters = StabilityCounters()
        self.spikes = SpikeDetector(factor=run.train.spike_factor)
        self._hooks: list[tuple[Hook, int]] = []
        self._step_rates: list[float] = []
        self._mfus: list[float] = []
        self._mfus_fp8: list[float] = []
        self.losses: list[float] = []
        """Every step's train loss (all ranks' mean), for the loss-curve checksum."""
        self.raw_model = unwrap(model)
        """The model inside DDP / torch.compile: what the telemetry hooks and names refer to."""
        self.nonfinite = NonFiniteMonitor(self.raw_model)
        self.probe = NumericsProbe(recipe.casts)
        self.swiglu = SwigluMonitor(self.raw_model)
        self.grad_norms = GradNormWindow()
        self.rank_timer = RankTimer(dist_info.device)
        self.rank_timer.watch(model)  # after parallelize: the wait after the last gradient is communication
        self.checkpointer = checkpointer
        """engine.checkpoint.Checkpointer: saves every train.checkpoint_every steps and on SIGTERM
        (None: no checkpoints)."""
        self.preemption = Preemption()
        self.restarts = restarts
        """How many times this trial restarted from a checkpoint before this attempt."""
        self.rollback = rollback if rollback is not None else Rollback()
        """train.on_divergence=rollback: the retries so far and the learning-rate scale and
        precision this attempt runs with (the caller built the model in that precision)."""
        # the optimizer and schedule were built at the configured learning rate
        scale_lr(self, loaded=1.0, wanted=self.rollback.lr_scale)
        factor = run.debug.slowdown[dist_info.rank] if run.debug.slowdown else 1.0
        self.slowdown = Slowdown(factor, timer=self.rank_timer) if factor > 1.0 else None
        """debug.slowdown above 1 on this rank: the emulated slower device (reads rank_timer's clock)."""

    def is_sample_step(self, step: int) -> bool:
        """Numerics are sampled on the first step and every train.numerics_every-th."""
        every = self.run.train.numerics_every
        return bool(every) and (step == 1 or step % every == 0)

    def add_hook(self, fn: Hook, *, every: int = 1) -> None:
        """Call fn(trainer, step, metrics) after every `every`-th optimizer step."""
        self._hooks.append((fn, every))

    # -- one micro-batch -------------------------------------------------------------------
    def forward_backward_step(self, inputs: torch.Tensor, targets: torch.Tensor,
                              *, accum_steps: int = 1, weight: float | None = None) -> torch.Tensor:
        """Forward and scaled backward of one micro-batch; returns its detached loss. The loss
        is multiplied by `weight` (uneven shares) or else divided by accum_steps."""
        with self.recipe.autocast():
            logits = self.model(inputs)
        loss = token_loss(logits, targets)  # masked targets (-100) carry no loss; all masked: 0, not NaN
        self.recipe.scale(loss / accum_steps if weight is None else loss * weight).backward()
        return loss.detach()

    # -- one optimizer step ----------------------------------------------------------------
    def train_step(self, micro_batches: list[Batch], *, sample: bool = False) -> StepResult:
        self.rank_timer.start_step()
        try:
            return self._train_step(micro_batches, sample=sample)
        finally:
            self.rank_timer.end_step()

    def _train_step(self, micro_batches: list[Batch], *, sample: bool) -> StepResult:
        self.optimizer.zero_grad(set_to_none=True)
        if sample:
            self.probe.arm(loss_scale=self.recipe.loss_scale)
            self.swiglu.arm()
        n = len(micro_batches)
        # uneven shares (set by the balancer): weight each micro-batch by its share of the batch
        weighted = self.balancer is not None and self.batches.balanced
        loss_sum = torch.zeros((), device=self.dist.device)
        if self.pipeline is not None:  # the schedule runs the micro-batches through the stages
            with self.recipe.autocast():
                loss_sum += n * self.pipeline.step(torch.cat([x for x, _ in micro_batches]),
                                                   torch.cat([y for _, y in micro_batches]))
            self.rank_timer.add_compute(self.pipeline.last_busy_spans)  # its clock excludes bubbles
            if self.pipeline.dp_group is not None:  # replicas of this stage average their gradients
                allreduce_grads(list(self.model.parameters()), group=self.pipeline.dp_group,
                                ordered=self.run.train.deterministic)
        else:
            with self.rank_timer.compute():
                for i, (x, y) in enumerate(micro_batches):
                    x, y = x.to(self.dist.device, non_blocking=True), y.to(self.dist.device, non_blocking=True)
                    # all-reduce gradients only once per optimizer step, on the last micro-batch
                    with no_sync(self.model, last_micro_batch=i == n - 1), self._slowed(len(x)):
                        if weighted:
                            w = loss_weight(len(x), dp_size=self.batches.dp_size,
                                            global_batch_size=self.batches.global_batch_size)
                            loss_sum += w * self.forward_backward_step(x, y, weight=w)
                        else:
                            loss_sum += self.forward_backward_step(x, y, accum_steps=n)
            if self.balancer is not None and self.balancer.measuring(self.step + 1):  # reading syncs a GPU
                self.balancer.observe(self.step + 1, sequences=sum(len(x) for x, _ in micro_batches),
                                      compute_s=self.rank_timer.step_compute_s)
        stages = self.pipeline.group if self.pipeline is not None else None  # numerics of every stage
        numerics = self.probe.collect(group=stages) | self.swiglu.collect() if sample else {}
        self.recipe.unscale(self.optimizer)
        params = [p for p in self.model.parameters() if p.requires_grad]
        norm = self._clip_gradients(params)
        # weighted losses already sum to this rank's part of the global mean (times dp)
        local = loss_sum.double() if weighted else loss_sum.double() / n
        # the step's one device->host copy: the update must know whether the gradients are
        # finite, and the stability bookkeeping needs the loss of every step
        loss, grad_norm, local_loss = torch.stack(
            [mean_over_ranks(local), norm.double().to(local.device), local]).tolist()
        meter = UpdateMeter(self.optimizer, params) if sample else None  # steps in chunks, no full copy
        with self.rank_timer.compute(), meter.measuring() if meter else contextlib.nullcontext():
            applied = self.recipe.step(self.optimizer, grads_finite=math.isfinite(grad_norm))
        self.scheduler.step()
        result = StepResult(loss=loss, grad_norm=grad_norm, applied=applied)
        if not result.finite:
            result.origin = self._nonfinite_origin([x for x, _ in micro_batches],
                                                   loss_finite=math.isfinite(local_loss))
        self.grad_norms.add(grad_norm)
        if sample:
            if applied:
                numerics |= meter.result(stages=stages)
            numerics |= w13_alignment(self.raw_model) | self.grad_norms.percentiles()
            result.numerics = gather_over_stages(numerics, group=stages)
        return result

    def _slowed(self, sequences: int):
        """The emulated slower device around one micro-batch (a no-op at full speed)."""
        return self.slowdown.micro_batch(sequences) if self.slowdown is not None else contextlib.nullcontext()

    def _clip_gradients(self, params: list[torch.Tensor]) -> torch.Tensor:
        """The global gradient norm before clipping, a 0-dim tensor left on the device (no
        host sync). Clips only by a finite norm, decided on the device: scaling by max_norm /
        inf or NaN would turn every gradient NaN and hide which one went first."""
        if self.pipeline is not None:  # the norm over every stage of the pipeline
            from trainlab.parallel.pp import global_grad_norm_tensor

            norm = global_grad_norm_tensor(self.pipeline.stages, self.pipeline.group)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
            if isinstance(norm, DTensor):  # sharded gradients: the norm as torchtitan takes it
                norm = norm.full_tensor()
        if self.run.optim.grad_clip:
            # a non-finite norm clips by 0 + eps: the coefficient clamps to 1, gradients unchanged
            finite = torch.where(torch.isfinite(norm), norm, torch.zeros_like(norm))
            clip_grads_with_norm_(params, self.run.optim.grad_clip, finite)
        return norm

    def _nonfinite_origin(self, inputs: list[torch.Tensor], *, loss_finite: bool) -> str:
        """The first non-finite tensor over all ranks: an activation beats the loss beats a
        gradient (that is the order they are computed in); ties go to the lowest rank."""
        inputs = [x.to(self.dist.device) for x in inputs]
        if self.pipeline is not None:  # a stage cannot be replayed alone: name the loss or a gradient
            local = LOSS if not loss_finite else self.nonfinite.first_gradient()
        else:
            local = self.nonfinite.origin(inputs, self.recipe.autocast, loss_finite=loss_finite)
        origins = [o for o in gather_strings(local) if o]
        for kind in (ACTIVATION, LOSS):
            for origin in origins:
                if origin.startswith(kind):
                    return origin
        return origins[0] if origins else ""

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the held-out batches of all ranks."""
        self.model.eval()
        total = 0.0
        if self.pipeline is not None:  # one pipelined pass over the whole held-out set
            with self.recipe.autocast():
                mean = float(self.pipeline.eval(torch.cat([x for x, _ in self.val]),
                                                torch.cat([y for _, y in self.val])))
            self.model.train()
            (mean,) = all_reduce_mean([mean], device=self.dist.device)
            return mean
        scored = 0  # batches with a target: one whose targets are all masked (loss_on=answer) has no loss to average
        for x, y in self.val:
            with self.recipe.autocast():
                logits = self.model(x.to(self.dist.device))
            total += float(token_loss(logits, y.to(self.dist.device)))
            scored += bool((y != IGNORE_INDEX).any())
        reshard(self.model)  # FSDP2: parameters are the masters again (checksums, probes read them)
        self.model.train()
        (mean,) = all_reduce_mean([total / max(1, scored)], device=self.dist.device)
        return mean

    # -- the loop --------------------------------------------------------------------------
    def train(self) -> TrialResult:
        # collectives called from Python (FSDP2, ZeRO-1, the loss all-reduce) are timed per rank
        try:
            with timed_collectives(into=self.rank_timer):
                return self._train()
        finally:  # SIGTERM goes back to its handler before this trainer (a bench's, the default)
            self.preemption.close()

    def _train(self) -> TrialResult:
        t = self.run.train
        status = names.STATUS_FINISHED
        last = StepResult(self.losses[-1] if self.losses else float("nan"), float("nan"), True)
        val_loss = float("nan")
        t_start = time.perf_counter()
        self.model.train()
        self.throughput.restart()
        self._warmup_step = self.step + 1  # this attempt's first step (after a resume too)
        reset_peak_memory(self.dist.device)  # not the build's nor a checkpoint load's memory
        while self.step < t.max_steps:
            micro_batches = self.batches.next_step()
            lr = self.scheduler.get_last_lr()[0]
            last = self.train_step(micro_batches, sample=self.is_sample_step(self.step + 1))
            self.step += 1
            self.losses.append(last.loss)
            self.tokens_seen += self.batches.tokens_per_step
            perf = self.throughput.step()
            if self.step > 1:  # the first step pays for warm-up and allocation
                self._step_rates.append(perf["tokens_per_s"])
                if "mfu" in perf:
                    self._mfus.append(perf["mfu"])
                if "mfu_fp8" in perf:
                    self._mfus_fp8.append(perf["mfu_fp8"])
            # a collective at the step the measured shares are fixed: after the timed step
            balance = self.balancer.after_step(self.step) if self.balancer is not None else {}

            # ---- stability bookkeeping (every step, cheap) ----
            self.counters.record(step=self.step, loss=last.loss, grad_norm=last.grad_norm,
                                 applied=last.applied, origin=last.origin)
            self.spikes.update(last.loss)
            # a loss scaler turns overflowing gradients into skipped steps; without one a
            # non-finite gradient is as final as a non-finite loss
            diverged = t.stop_on_nonfinite and not last.finite and (
                not math.isfinite(last.loss) or not self.recipe.skips_overflow)

            # ---- metrics, validation, hooks ----
            if balance:
                self.tracker.log_metrics(balance, step=self.step)
            metrics: dict[str, float] = {}
            if self.step % t.log_every == 0 or diverged or self.step == t.max_steps:
                metrics = self._step_metrics(last, lr, perf)
            if self.is_sample_step(self.step) or self.step == t.max_steps:
                # per rank, averaged since the last sample; a collective, so at steps every rank
                # agrees on (the sample steps and the last)
                local = self.rank_timer.window() | memory_metrics(self.model, self.optimizer, self.dist.device)
                metrics |= gather_rank_metrics(local, device=self.dist.device) or {}
            if last.numerics:
                self.tracker.log_metrics(last.numerics, step=self.step)
            if not diverged and (self.step == t.max_steps or (t.eval_interval and self.step % t.eval_interval == 0)):
                val_loss = self.evaluate()
                metrics[names.VAL_LOSS] = val_loss
                self.tracker.log_metrics({names.by_tokens(names.VAL_LOSS): val_loss}, step=self.tokens_seen)
            if metrics:
                self.tracker.log_metrics(metrics, step=self.step)
                self.tracker.log_metrics({names.by_tokens(names.LOSS): last.loss}, step=self.tokens_seen)
            for fn, every in self._hooks:
                if self.step % every == 0 or diverged or self.step == t.max_steps:
                    fn(self, self.step, metrics)
            if diverged:
                status = names.STATUS_DIVERGED
                break
            self._inject_fault()
            stop = self.preemption.requested()  # preempted: resumes from a checkpoint; pruned: never
            if self.checkpointer is not None and (stop == PREEMPT or self._checkpoint_due()):
                self.tracker.sync()  # the metrics up to here outlive any crash after the checkpoint
                self.tracker.log_metrics(self.checkpointer.save(self), step=self.step)
            if stop == PREEMPT or (stop and self.step < t.max_steps):  # a prune that came late: it finished
                status = names.STATUS_PREEMPTED if stop == PREEMPT else names.STATUS_PRUNED
                break
            if self.step == self._warmup_step:  # from here sys/peak_mem_gb is the steady state
                reset_peak_memory(self.dist.device)
            self.throughput.restart()  # logging and validation are not training time

        return TrialResult(
            status=status, steps=self.step, tokens_seen=self.tokens_seen,
            final_loss=last.loss, final_val_loss=val_loss,
            tokens_per_s=_median(self._step_rates), mfu=_median(self._mfus) if self._mfus else None,
            peak_mem_gb=peak_memory_gb(self.dist.device),
            skipped_steps=self.counters.skipped_steps, nonfinite_steps=self.counters.nonfinite_steps,
            loss_spikes=self.spikes.spikes, elapsed_s=time.perf_counter() - t_start,
            # the loop stops on the step whose loss went non-finite; earlier non-finite
            # gradients (fp16 overflows the scaler skipped) are not the divergence
            diverged_step=self.step if status == names.STATUS_DIVERGED else None,
            first_nonfinite=last.origin if status == names.STATUS_DIVERGED else self.counters.first_nonfinite,
            loss_scale=self.recipe.loss_scale,
            mfu_fp8=_median(self._mfus_fp8) if self._mfus_fp8 else None,
            extra=self.checksums(),
        )

    def _inject_fault(self) -> None:
        """debug.inject_fault: signal this rank's own process at the chosen step (first attempt only)."""
        fault = self.run.debug.fault_injection
        if fault is None or self.restarts or fault[1:] != (self.step, self.dist.rank):
            return
        os.kill(os.getpid(), {"sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}[fault[0]])
        time.sleep(0.1)  # let the handler run before the step's preemption vote

    # -- its state: what a checkpoint holds (engine.checkpoint writes and reads it) ------------
    def state_dict(self) -> dict:
        """This rank's whole state as tensors and plain values: `model` and `optim` as
        torch.distributed.checkpoint saves them (each rank its shards; no `optim` with ZeRO-1),
        and `local`, the rest of this rank's own: the loop's step, tokens seen, loss curve and
        throughput history, the stability and numerics monitors, the LR schedule, the recipe's
        loss scaler or FP8 scales, the data position, a ZeRO-1 shard, the RNG states, and the
        precision and rollback this attempt runs with."""
        local = {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "losses": list(self.losses),
            "counters": asdict(self.counters),
            "spikes": asdict(self.spikes),
            "grad_norms": list(self.grad_norms.norms),
            "step_rates": list(self._step_rates),
            "mfus": list(self._mfus),
            "mfus_fp8": list(self._mfus_fp8),
            "scheduler": self.scheduler.state_dict(),
            "recipe": self.recipe.state_dict(),
            "batches": self.batches.state_dict(),
            **({"balancer": self.balancer.state_dict()} if self.balancer is not None else {}),
            "precision": self.run.precision.name,
            "rollback": self.rollback.as_state(),
            **zero1_state(self.optimizer),
            "rng": rng_state(),
        }
        return {**sharded_state(self.model, self.optimizer), "local": local}

    def load_state_dict(self, state: dict) -> None:
        """Back to `state` (a state_dict, e.g. a checkpoint's). The loss scaler and FP8 scales
        of another precision (a rollback's retry in a higher one) are left as built: they start
        afresh. The optimizer and schedule come at the learning-rate scale of the rollback they
        were saved in, and are brought to this attempt's."""
        load_sharded_state(self.model, self.optimizer, state)
        local = state["local"]
        self.step = int(local["step"])
        self.tokens_seen = int(local["tokens_seen"])
        self.losses[:] = local["losses"]
        vars(self.counters).update(local["counters"])
        vars(self.spikes).update(local["spikes"])
        self.grad_norms.norms[:] = local["grad_norms"]
        self._step_rates[:] = local["step_rates"]
        # absent from checkpoints older than the trainer's own state_dict: MFU is then the
        # median of the steps run since
        self._mfus[:] = local.get("mfus", [])
        self._mfus_fp8[:] = local.get("mfus_fp8", [])
        self.scheduler.load_state_dict(local["scheduler"])
        if local["precision"] == self.run.precision.name:
            self.recipe.load_state_dict(local["recipe"])
        self.batches.load_state_dict(local["batches"])
        if self.balancer is not None and "balancer" in local:
            self.balancer.load_state_dict(local["balancer"])
        load_zero1_state(self.optimizer, local)
        scale_lr(self, loaded=Rollback.from_state(local["rollback"]).lr_scale, wanted=self.rollback.lr_scale)
        set_rng_state(local["rng"])  # last: loading the optimizer may have drawn random numbers

    def _checkpoint_due(self) -> bool:
        every = self.run.train.checkpoint_every
        return bool(every) and self.step % every == 0 and self.step < self.run.train.max_steps

    def checksums(self) -> dict:
        """The reproducibility checksums of the parameters as they are now and of the loss curve
        so far (telemetry.checksum); a collective: every rank calls it at the same point."""
        if self.pipeline is not None:  # each rank holds some stages, under the model's names
            params = params_checksum(self.pipeline.stages, partial=True)
        else:
            params = params_checksum([self.model])
        return {names.TAG_PARAMS_SHA: params.sha256, names.TAG_LOSS_CURVE_SHA: loss_curve_sha256(self.losses),
                names.PARAM_NORM: params.norm}

    def _step_metrics(self, last: StepResult, lr: float, perf: dict[str, float]) -> dict[str, float]:
        m = {
            names.LOSS: last.loss,
            names.LR: lr,
            names.GRAD_NORM: last.grad_norm,
            names.TOKENS_PER_S: perf["tokens_per_s"],
            names.STEP_TIME_S: perf["step_time_s"],
            names.MODEL_TFLOPS: perf["model_tflops"],
            names.SKIPPED_STEPS: self.counters.skipped_steps,
            names.NONFINITE_STEPS: self.counters.nonfinite_steps,
            names.LOSS_SPIKES: self.spikes.spikes,
            names.TOKENS_SEEN: self.tokens_seen,
            # the warm-up step's peak apart: sys/peak_mem_gb compares layouts in their steady state
            (names.PEAK_MEM_WARMUP_GB if self.step == self._warmup_step else names.PEAK_MEM_GB):
                peak_memory_gb(self.dist.device),
        }
        now = memory_gb(self.dist.device)  # CUDA only
        if now:
            m[names.MEM_ALLOCATED_GB], m[names.MEM_RESERVED_GB] = now["allocated"], now["reserved"]
        if "mfu" in perf:
            m[names.MFU] = perf["mfu"]
        if "mfu_fp8" in perf:
            m[names.MFU_FP8] = perf["mfu_fp8"]
        if self.pipeline is not None and self.pipeline.last_busy_fraction is not None:
            m[names.PP_BUBBLE_THEORY] = self.pipeline.bubble_fraction_theory
            m[names.PP_BUBBLE] = 1.0 - self.pipeline.last_busy_fraction
        if self.recipe.loss_scale is not None:
            m[names.LOSS_SCALE] = self.recipe.loss_scale
        # MLflow stores floats; NaN/inf are kept as such so divergence is visible in the UI
        return m


def _median(xs: list[float]) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[len(s) // 2]
