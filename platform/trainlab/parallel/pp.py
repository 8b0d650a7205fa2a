"""Pipeline parallel: the blocks cut into stages, run by torch.distributed.pipelining.

    check_pp(n_layers=4, pp=2, batch=8, n_microbatches=4, schedule="1f1b")
    pipe = build_pipeline(model, mesh_or_group=mesh, pp_rank=r, pp_size=2, schedule="1f1b",
                          n_microbatches=4, loss_fn=loss_fn, device=device)
    optimizer, _ = build_optimizer(nn.ModuleList(pipe.stages), run.optim, max_steps=n)
    loss = pipe.step(tokens, targets)            # forward + backward of the whole batch
    norm = clip_grad_norm_(pipe.stages, max_norm=1.0, group=pipe.group)

A stage is a copy of the `Transformer` that keeps only its share: a contiguous range of
blocks (an ``nn.ModuleDict`` keyed by their index in the full model, so parameter names stay
``layers.<i>.…``), the embedding on the first stage, the final norm and head on the last.
Every rank builds the same seeded full model and cuts its stages out of it, so the stages
together hold exactly the single-process model's parameters.

With ``virtual_stages`` v > 1 (interleaved 1F1B) the model is cut into pp * v stages and rank r
owns stages r, r + pp, r + 2 pp, ... (torch's "loop" placement), so the first stage lives on
pp rank 0 and the last on pp rank pp - 1 for every schedule.
"""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from trainlab.clock import Mark, device_clock, total_seconds
from trainlab.config.layout_types import bubble_fraction
from trainlab.config.schema import PP_SCHEDULES
from trainlab.config.validate import check_pp_layout
from trainlab.models.transformer import Transformer

SCHEDULES = PP_SCHEDULES


# ---------------------------------------------------------------------------------------
def check_pp(*, n_layers: int, pp: int, virtual_stages: int = 1, batch: int, n_microbatches: int,
             schedule: str) -> None:
    """Refuse a pipeline layout that cannot run, naming the fields, their values and a fix.

    `batch` is the sequences one pipeline sees per step (train.global_batch_size / dp).
    """
    check_pp_layout(n_layers=n_layers, pp=pp, virtual_stages=virtual_stages,
                  n_microbatches=n_microbatches, schedule=schedule)
    if batch <= 0 or batch % n_microbatches:
        raise ValueError(
            f"batch={batch} sequences per pipeline (train.global_batch_size / dp) does not split "
            f"into parallel.pp_microbatches={n_microbatches} equal micro-batches; use a divisor of "
            f"{batch} (equal micro-batches make the mean of their losses the full batch's loss)"
        )


# ---------------------------------------------------------------------------------------
def split_stages(model: Transformer, *, pp_rank: int, pp_size: int,
                 virtual_stages: int = 1) -> list[nn.Module]:
    """The stage modules `pp_rank` owns, in stage order: pruned copies of `model`.

    `model` is left whole. Each copy starts as a deep copy, so build the full model under
    ``torch.device("meta")`` (a copy then costs nothing), then `models.init.materialize` the
    stages: their blocks keep the full model's names, so they get the one-process values.
    """
    n_layers = len(model.blocks())
    num_stages = pp_size * virtual_stages
    assert n_layers % num_stages == 0, "check_pp first: layers must split evenly"
    per_stage = n_layers // num_stages
    stages = []
    for v in range(virtual_stages):
        index = v * pp_size + pp_rank
        stage = copy.deepcopy(model)
        blocks = stage.blocks()
        stage.layers = nn.ModuleDict(
            {str(i): blocks[i] for i in range(index * per_stage, (index + 1) * per_stage)})
        if index != 0:
            stage.tok_embeddings = None
        if index != num_stages - 1:
            stage.norm = None
            stage.output = None
        stages.append(stage)
    return stages


def _on_meta(module: nn.Module) -> bool:
    return any(p.is_meta for p in module.parameters())


def _pp_group(mesh_or_group) -> dist.ProcessGroup | None:
    """The pipeline group: a mesh's "pp" dimension (or its only one), a group, or None (world)."""
    if mesh_or_group is None or isinstance(mesh_or_group, dist.ProcessGroup):
        return mesh_or_group
    names = mesh_or_group.mesh_dim_names or ()
    if "pp" in names:
        return mesh_or_group["pp"].get_group()
    if mesh_or_group.ndim == 1:
        return mesh_or_group.get_group()
    raise ValueError(f"a {mesh_or_group.ndim}-D mesh with dims {names} has no 'pp' dimension; "
                     "name the pipeline dimension 'pp'")


# ---------------------------------------------------------------------------------------
class _Clock:
    """Spans of compute (forward, backward, loss chunks) on the device's clock (trainlab.clock:
    CUDA events on a GPU, so timing a chunk never waits for the GPU; read at log steps)."""

    def __init__(self, device: torch.device) -> None:
        self.clock = device_clock(device)
        self.spans: list[tuple[Mark, Mark]] = []

    def timed(self, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            start = self.clock.mark()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spans.append((start, self.clock.mark()))
        return wrapper


class _TimedStage(PipelineStage):
    """A PipelineStage whose forward and backward compute adds to a shared `_Clock`."""

    def __init__(self, *args, clock: _Clock, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._clock = clock

    def forward_one_chunk(self, *args, **kwargs):
        return self._clock.timed(super().forward_one_chunk)(*args, **kwargs)

    def backward_one_chunk(self, *args, **kwargs):
        return self._clock.timed(super().backward_one_chunk)(*args, **kwargs)

    def backward_weight_one_chunk(self, *args, **kwargs):
        return self._clock.timed(super().backward_weight_one_chunk)(*args, **kwargs)

    # On its first step torch learns the shapes a stage sends by running it once more: on
    # uninitialized tensors (2.13 also runs its backward) or zeros (2.11, forward only) for every
    # stage but the first. In eval mode no layer learns from that pass (delayed FP8 amax
    # histories, the numerics and SwiGLU probes and NaN injection look at module.training); a
    # backward pass is traced by this forward, so it records nothing either. Shapes and dtypes
    # are the same. torch 2.13 calls the pass _forward_metadata_inference, 2.11 _shape_inference;
    # each torch calls only its own.

    def _forward_metadata_inference(self, *args, **kwargs):
        with _eval_mode(self.submod):
            return super()._forward_metadata_inference(*args, **kwargs)

    def _shape_inference(self, *args, **kwargs):
        with _eval_mode(self.submod):
            return super()._shape_inference(*args, **kwargs)


@contextlib.contextmanager
def _eval_mode(module: nn.Module):
    """`module` and its children in eval mode inside, each back to its own mode after."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


class Pipeline:
    """This rank's part of a pipeline: its stage modules and the schedule that runs them."""

    def __init__(self, *, stages: list[nn.Module], new_schedule: Callable[[], object],
                 group: dist.ProcessGroup | None, pp_rank: int, pp_size: int, n_microbatches: int,
                 virtual_stages: int, clock: _Clock, device: torch.device) -> None:
        self.stages = stages
        """This rank's stage modules (for the optimizer, checkpoints and clipping)."""
        self.group = group
        self.pp_rank, self.pp_size = pp_rank, pp_size
        self.n_microbatches = n_microbatches
        self.is_first = pp_rank == 0  # loop placement: stage 0 on rank 0, the last on rank pp-1
        self.is_last = pp_rank == pp_size - 1
        self.bubble_fraction_theory = bubble_fraction(
            pp=pp_size, n_microbatches=n_microbatches, virtual_stages=virtual_stages)
        self.dp_group: dist.ProcessGroup | None = None
        """Set by the caller when stages are replicated (dp x pp): gradients are averaged over it."""
        self.last_busy_spans: list[tuple[Mark, Mark]] = []
        """The last step's compute spans on this rank (forward, backward, loss), as clock marks
        (trainlab.clock) for a RankTimer of the same device."""
        self._last_wall: tuple[Mark, Mark] | None = None
        # One torch schedule (and its PipelineStages, over the same modules) per pass and batch
        # shape: a stage learns the shapes it receives and sends on its first call and keeps
        # them. torch 2.11 keeps them for good, so an evaluation batch of another size than the
        # training one is refused (PipeliningShapeError); 2.13 infers them again after every
        # switch between step and eval, forward and backward. Built on first use, the same
        # call on every rank (every rank is given the same batch shape).
        self._new_schedule = new_schedule
        self._schedules: dict[tuple[str, tuple[int, ...]], object] = {}
        self._clock = clock
        self._device = torch.device(device)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, *,
             broadcast_loss: bool = True) -> torch.Tensor | None:
        """Forward and backward of one batch over n_microbatches; gradients accumulate into
        the stages' ``.grad`` as the mean over micro-batches (= the full batch's, equal sizes).

        Every rank passes the same `inputs` [B, T] and `targets` [B, T] (each uses what its
        stages need). Returns the mean micro-batch loss (float32, 0-dim): on every rank with
        `broadcast_loss`, else on the last stage's rank only (None elsewhere).
        """
        clock = self._clock.clock
        self._clock.spans = []
        start = clock.mark()
        loss = self._run("step", inputs, targets)
        self._last_wall = (start, clock.mark())
        self.last_busy_spans = self._clock.spans
        return self._share(loss, broadcast_loss)

    @property
    def last_busy_s(self) -> float:
        """Seconds of the last step this rank spent computing (forward, backward, loss); on
        CUDA reading it waits for that step (a host sync)."""
        return total_seconds(self._clock.clock, self.last_busy_spans)

    @property
    def last_busy_fraction(self) -> float | None:
        """Share of the last step's wall time this rank spent in forward/backward compute;
        1 - it is the measured bubble (plus communication). None before the first step; on
        CUDA reading it waits for that step (a host sync)."""
        if self._last_wall is None:
            return None
        wall = self._clock.clock.seconds(*self._last_wall)
        return self.last_busy_s / wall if wall > 0 else float("nan")

    @torch.no_grad()
    def eval(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward only (validation): the batch's mean micro-batch loss, on every rank."""
        return self._share(self._run("eval", inputs, targets), True)

    def _run(self, how: str, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        if inputs.shape[0] % self.n_microbatches:
            raise ValueError(f"batch={inputs.shape[0]} does not split into parallel.pp_microbatches="
                             f"{self.n_microbatches} equal micro-batches; use a divisor of it")
        losses: list[torch.Tensor] = []
        # non_blocking: a blocking copy from pageable memory would wait for the device's queue.
        # contiguous: torch 2.11 records the first stage's input layout from a contiguous copy
        # and refuses micro-batches with other strides, e.g. x[:, :-1] of [B, T + 1] windows
        # ("stride mismatch: expected (T, 1) actual (T + 1, 1)"); a no-op for contiguous input.
        args = (inputs.to(self._device, non_blocking=True).contiguous(),) if self.is_first else ()
        kwargs = dict(target=targets.to(self._device, non_blocking=True), losses=losses) if self.is_last else {}
        key = (how, tuple(inputs.shape))
        if key not in self._schedules:
            self._schedules[key] = self._new_schedule()
        getattr(self._schedules[key], how)(*args, **kwargs)
        return torch.stack([x.detach().float() for x in losses]).mean() if self.is_last else None

    def _share(self, loss: torch.Tensor | None, broadcast_loss: bool) -> torch.Tensor | None:
        if not broadcast_loss or self.pp_size == 1:
            return loss
        if loss is None:
            loss = torch.zeros((), device=self._device)
        dist.broadcast(loss, group=self.group, group_src=self.pp_size - 1)
        return loss


def build_pipeline(model: Transformer, *, mesh_or_group, pp_rank: int, pp_size: int,
                   schedule: str, n_microbatches: int, loss_fn: Callable, device: torch.device,
                   virtual_stages: int = 1,
                   wrap: Callable[[nn.Module], nn.Module] | None = None) -> Pipeline:
    """Cut `model` into stages, keep this rank's on `device`, and wrap them in a schedule.

    `mesh_or_group`: a DeviceMesh (its "pp" dimension, or its only one), a ProcessGroup, or
    None for the world. `loss_fn(logits, targets)` is one micro-batch's mean loss; torch
    divides gradients by n_microbatches, so the step's gradient is the full-batch mean's.
    `wrap`: applied to each stage module before it becomes a PipelineStage (e.g. DDP over the
    data-parallel group; torch's stage skips its gradient sync until the last micro-batch).
    """
    check_pp_layout(n_layers=len(model.blocks()), pp=pp_size, virtual_stages=virtual_stages,
                  n_microbatches=n_microbatches, schedule=schedule)
    group = _pp_group(mesh_or_group)
    assert dist.get_world_size(group) == pp_size and dist.get_rank(group) == pp_rank, (
        "pp_rank / pp_size disagree with the pipeline process group")
    clock = _Clock(device)
    # a meta-device model's stages stay on meta: the caller materialises them (models.init)
    modules = [m if _on_meta(m) else m.to(device)
               for m in split_stages(model, pp_rank=pp_rank, pp_size=pp_size, virtual_stages=virtual_stages)]
    num_stages = pp_size * virtual_stages
    run_as = [wrap(m) if wrap is not None else m for m in modules]
    timed_loss = clock.timed(loss_fn)  # the last stage's loss is compute too

    def new_schedule():
        stages = [_TimedStage(m, v * pp_size + pp_rank, num_stages, torch.device(device), group=group,
                              clock=clock) for v, m in enumerate(run_as)]
        if schedule == "interleaved_1f1b":
            return ScheduleInterleaved1F1B(stages, n_microbatches=n_microbatches, loss_fn=timed_loss)
        cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
        return cls(stages[0], n_microbatches=n_microbatches, loss_fn=timed_loss)

    return Pipeline(stages=modules, new_schedule=new_schedule, group=group, pp_rank=pp_rank, pp_size=pp_size,
                    n_microbatches=n_microbatches, virtual_stages=virtual_stages, clock=clock,
                    device=device)


# ---------------------------------------------------------------------------------------
@torch.no_grad()
def global_grad_norm(stages: list[nn.Module], group: dist.ProcessGroup | None) -> float:
    """L2 norm of the gradients of every stage of the pipeline, not just this rank's:
    squared norms summed here, all-reduced over the pp group, then the root."""
    return math.sqrt(_grad_norm_sq(stages, group).item())


@torch.no_grad()
def global_grad_norm_tensor(stages: list[nn.Module], group: dist.ProcessGroup | None) -> torch.Tensor:
    """global_grad_norm as a float32 0-dim tensor on the device, without a host sync (the root
    taken in float64: the same value as global_grad_norm rounded to float32)."""
    return _grad_norm_sq(stages, group).double().sqrt().float()


def _grad_norm_sq(stages: list[nn.Module], group: dist.ProcessGroup | None) -> torch.Tensor:
    grads = [p.grad for stage in stages for p in stage.parameters() if p.grad is not None]
    device = grads[0].device if grads else next(stages[0].parameters()).device
    sq = (torch.stack([g.float().pow(2).sum() for g in grads]).sum() if grads
          else torch.zeros((), device=device))
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=group)
    return sq


@torch.no_grad()
def clip_grad_norm_(stages: list[nn.Module], *, max_norm: float,
                    group: dist.ProcessGroup | None) -> float:
    """Scale every stage's gradients so the pipeline's global norm is at most `max_norm`
    (torch.nn.utils.clip_grad_norm_'s rule, over all stages); returns the norm before."""
    norm = global_grad_norm(stages, group)
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        for stage in stages:
            for p in stage.parameters():
                if p.grad is not None:
                    p.grad.mul_(coef)
    return norm


__all__ = ["SCHEDULES", "Pipeline", "build_pipeline", "check_pp",
           "clip_grad_norm_", "global_grad_norm", "global_grad_norm_tensor", "split_stages"]
