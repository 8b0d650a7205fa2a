"""Bytes each rank of a trial holds at its peak, before it runs.

    mems = rank_memories(run, device_type="cuda")     # one RankMemory per global rank
    mems[0].state, mems[0].activations, mems[0].total_gb

Counted (estimate.shards: the layout's own shards of the meta-device model): parameters,
gradients (the parameters' dtype and shards), optimizer state (engine.schedule's choice of
torch AdamW or LowPrecisionAdamW, the moment dtypes of optim.* / precision.bf16_update, the
`step` scalar, FP8 moment scales, Kahan buffers; ZeRO-1's partition), FP8 scale state. These
equal parallel.fsdp.sharded_bytes of a real trial on every rank (tests/distributed/
test_estimate_memory_ranks.py). Modelled (estimate.activations): activations of the
micro-batches in flight and the transient buffers at the peak.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from trainlab.config import RunConfig
from trainlab.config.layout_types import TrialLayout, coords, fsdp_shards
from trainlab.estimate.activations import rank_activations
from trainlab.estimate.result import RankMemory
from trainlab.estimate.shards import (
    Shard,
    Sharding,
    optimizer_shards,
    prepared_model,
    rank_shards,
    stage_modules,
)

STEP_BYTES = 4
"""AdamW's per-parameter `step`: a float32 scalar tensor (torch's and LowPrecisionAdamW's)."""
SCALE_BYTES = 4
"""One float32 scale: an FP8 moment's (LowPrecisionAdamW) or a torchao weight's precomputed one."""


@dataclass(frozen=True)
class StateBytes:
    """What one rank stores of the model, counted."""

    params: int
    grads: int
    optim_state: int
    fp8_state: int
    model_buffers: int
    """The model's own buffers (rotary tables), one copy per pipeline stage held."""


def rank_memories(run: RunConfig, *, trial_layout: TrialLayout, device_type: str,
                  micro_batches: Sequence[int] | None = None) -> list[RankMemory]:
    """One RankMemory per global rank of `run` on devices of `device_type` ("cuda" or "cpu":
    it decides which casts are emulated, as on the workers). `runtime` is left 0.
    `micro_batches`: per data-parallel rank, the sequences of its largest micro-batch where the
    batch is not split equally (parallel.dp_balance=weighted gives faster ranks larger ones);
    None = the config's micro-batch on every rank. `trial_layout`: the plan's (plan.derive_layout)."""
    from trainlab.distributed import backend_for

    layout = Sharding.of(run, trial_layout)
    backend = backend_for(device_type) if fsdp_shards(layout.dims, run.parallel) else ""
    model, recipe = prepared_model(run, device_type=device_type, fsdp_backend=backend)
    out: list[RankMemory] = []
    cache: dict[tuple, RankMemory] = {}
    for rank in range(layout.dims.world_size):
        at = coords(rank, layout.dims)
        sequences = micro_batches[at.dp_rank] if micro_batches else None
        key = (at.pp_rank, at.tp_rank, at.dp_rank if layout.fsdp or layout.zero1 else 0, sequences)
        if key not in cache:
            state = state_bytes(run, model=model, recipe=recipe, rank=rank, trial_layout=trial_layout)
            act = rank_activations(run, model=model, recipe=recipe, rank=rank, device_type=device_type,
                                   sequences=sequences, trial_layout=trial_layout)
            cache[key] = RankMemory(params=state.params, grads=state.grads, optim_state=state.optim_state,
                                    fp8_state=state.fp8_state, activations=act.activations,
                                    buffers=act.buffers + state.model_buffers)
        out.append(cache[key])
    return out


def state_bytes(run: RunConfig, *, model: nn.Module, recipe, rank: int,
                trial_layout: TrialLayout) -> StateBytes:
    """Rank `rank`'s counted bytes; `model`, `recipe`: estimate.shards.prepared_model's."""
    shards = rank_shards(model, run, rank=rank, trial_layout=trial_layout)
    params = sum(s.nbytes for s in shards)
    owned = optimizer_shards(shards, run, rank=rank, trial_layout=trial_layout)
    layout = Sharding.of(run, trial_layout)
    parts = stage_modules(model, layout, coords(rank, layout.dims).pp_rank)
    return StateBytes(params=params, grads=sum(s.grad_nbytes for s in shards),
                      optim_state=optim_state_bytes(owned, run, all_shards=shards),
                      fp8_state=fp8_state_bytes(parts, recipe),
                      model_buffers=sum(b.numel() * b.dtype.itemsize for part in parts for b in part.buffers()
                                        if not _is_fp8_buffer(part, b)))


def optimizer_kind(run: RunConfig, *, shards: list[Shard]) -> tuple[str, str, str]:
    """(exp_avg dtype, exp_avg_sq dtype, bf16_update) as engine.schedule.build_optimizer picks
    them: fp32 names mean "the parameter's own dtype" for torch's AdamW ("param"); bf16
    parameters with bf16_update stochastic/kahan take LowPrecisionAdamW with fp32 moments
    stored as bf16. `shards`: every parameter the rank's optimizer was built with."""
    o = run.optim
    m, v, update = o.exp_avg_dtype, o.exp_avg_sq_dtype, "plain"
    bf16_update = run.precision.bf16_update
    if bf16_update != "plain" and any(s.dtype == torch.bfloat16 for s in shards):
        return m.replace("fp32", "bf16"), v.replace("fp32", "bf16"), bf16_update
    if m == v == "fp32":
        return "param", "param", update  # torch.optim.AdamW: zeros_like(param)
    return m, v, update


def optim_state_bytes(owned: list[Shard], run: RunConfig, *, all_shards: list[Shard]) -> int:
    """AdamW state of the parameters in `owned` (after its first step)."""
    from trainlab.precision.lowp_adamw import STATE_DTYPES

    m, v, update = optimizer_kind(run, shards=all_shards)
    total = 0
    for s in owned:
        total += STEP_BYTES
        for name in (m, v):
            dtype = s.dtype if name == "param" else STATE_DTYPES[name]
            total += s.numel * dtype.itemsize
            if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                total += SCALE_BYTES
        if update == "kahan" and s.dtype == torch.bfloat16:
            total += s.numel * s.dtype.itemsize  # kahan_comp: what rounding dropped, in bf16
    return total


def fp8_state_bytes(parts: list[nn.Module], recipe) -> int:
    """FP8 scale state of the layers in `parts`: fp8_delayed's buffers (amax history, scales,
    running amax; never sharded), or with torchao's float8 all-gather one precomputed float32
    scale per FP8 weight (current scaling keeps nothing else between steps)."""
    from trainlab.precision.fp8_delayed import DelayedScalingFp8Linear

    total = 0
    for part in parts:
        for module in part.modules():
            if isinstance(module, DelayedScalingFp8Linear):
                total += sum(b.numel() * b.dtype.itemsize for b in module.buffers(recurse=False))
    all_gather = getattr(recipe, "all_gather", None)
    if all_gather is not None and all_gather.enabled and recipe.plan is not None:
        names = {n for part in parts for n, _ in part.named_modules()}
        total += SCALE_BYTES * sum(1 for n in recipe.plan.lowp if n in names)
    return total


def _is_fp8_buffer(part: nn.Module, buffer: torch.Tensor) -> bool:
    from trainlab.precision.fp8_delayed import DelayedScalingFp8Linear

    return any(buffer is b for m in part.modules() if isinstance(m, DelayedScalingFp8Linear)
               for b in m.buffers(recurse=False))


__all__ = ["StateBytes", "fp8_state_bytes", "optim_state_bytes", "rank_memories", "state_bytes"]
