"""Tensor parallelism (Megatron-style) through torch's DTensor ``parallelize_module``.

The torchtitan Llama plan: in every block the projections that read the residual stream
(attention wq/wk/wv, MLP w1/w3) are column-sharded, so each rank computes its own heads
and its own MLP channels with no communication; the projections that write back into it
(wo, w2) are row-sharded and end in one all-reduce (or reduce-scatter) each. The
embedding is sharded by vocabulary rows, the output head by vocabulary columns and its
logits are all-gathered, so the model still returns full [B, T, V] logits on every rank
and the loss needs no change (no loss parallelism).

    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
    model = apply_tp(model, mesh=mesh, sequence_parallel=True)

Every TP rank must see the same batch. Every parameter becomes a DTensor (sharded or
replicated), so optimizers and ``get_total_norm`` see one kind of tensor; gradient norms
come back as DTensors and need ``full_tensor()`` before ``float()``.

With ``sequence_parallel`` the residual stream between blocks (and the norms) is sharded on
the sequence dim instead of replicated (Korthikanti et al. 2022): the all-reduces become
reduce-scatter + all-gather pairs of the same volume and activation memory outside the
matmuls drops by tp. Without it the norms run replicated, on full sequences.

A model this plan does not fit (model=custom, another family) brings its own in config,
model.tp_plan, which replaces it (parallel.tp_user).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from trainlab.config.hf_model import change_model_field
from trainlab.models.args import ModelArgs
from trainlab.models.block_names import block_names
from trainlab.parallel.tp_shapes import check_plan_shapes
from trainlab.parallel.tp_user import check_divisible, user_tp_plan


def check_tp(args: ModelArgs, tp: int) -> None:
    """Refuse a model that `apply_tp` cannot shard `tp` ways.

    Heads are the unit of attention sharding (a rank owns whole query and key/value
    heads), MLP channels the unit of MLP sharding. The vocabulary may be uneven: DTensor
    pads the last shard. Smooth-SwiGLU divides the row-sharded w2 weight by a per-rank
    vector of scales, which DTensor cannot mix with a plain tensor.

    Raises:
        ValueError: naming the field, its value and what to set instead.
    """
    if tp < 1:
        raise ValueError(f"parallel.tp={tp} must be >= 1")
    if tp == 1:
        return
    for field, value in (("n_heads", args.n_heads), ("n_kv_heads", args.n_kv_heads),
                         ("ffn_dim", args.ffn_dim)):
        if value % tp:
            divisors = [d for d in range(1, value + 1) if value % d == 0]
            raise ValueError(
                f"model.{field}={value} is not divisible by parallel.tp={tp}: tensor "
                f"parallelism gives every rank {field}/tp of them; set parallel.tp to a "
                f"divisor of {value} ({divisors}) or {change_model_field(field, hf=bool(args.hf_family))}")
    if args.hf_family == "qwen3":
        raise ValueError(
            f"model=hf with a qwen3 config is not tensor-parallel here (parallel.tp={tp}): its per-head "
            "query/key norms would see each rank's heads only; use parallel.tp=1 with "
            "parallel.data_parallel=fsdp, or parallel.pp to cut it by layers")
    if args.tie_embeddings:
        raise ValueError(
            f"model=hf with tie_word_embeddings=true is not tensor-parallel here (parallel.tp={tp}): the "
            "embedding and the head would shard one tensor twice; use parallel.tp=1 with "
            "parallel.data_parallel=fsdp")
    if args.smooth_swiglu:
        raise ValueError(
            f"model.smooth_swiglu=true is not supported with parallel.tp={tp} (the scaled "
            "w2 weight would mix a sharded DTensor with per-rank scales); set "
            "model.smooth_swiglu=false or parallel.tp=1")


class _Replicated(ParallelStyle):
    """Run a module on replicated inputs with its parameters as Replicate DTensors.

    The non-sequence-parallel counterpart of `SequenceParallel` for the norms: a plain
    tensor input is taken as the full (replicated) activation, and the output stays a
    Replicate DTensor for the next style to consume. Gradients of its parameters come out
    as Replicate DTensors, so every parameter of the model is a DTensor either way.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def to_replicate(_mod, inputs, mesh):
            x, *rest = inputs
            if isinstance(x, DTensor):
                if x.placements != (Replicate(),):
                    x = x.redistribute(placements=(Replicate(),))
            else:
                x = DTensor.from_local(x, mesh, (Replicate(),), run_check=False)
            return (x, *rest)

        # partition_fn=None replicates every parameter (broadcast from rank 0).
        return distribute_module(module, device_mesh, input_fn=to_replicate)


def _check_seq_len(_model: nn.Module, inputs: tuple, *, tp: int) -> None:
    seq_len = inputs[0].shape[1]
    if seq_len % tp:
        raise ValueError(
            f"sequence length {seq_len} is not divisible by parallel.tp={tp}: sequence "
            f"parallelism splits every sequence evenly over the tensor-parallel ranks; set "
            f"train.seq_len to a multiple of {tp} (or turn sequence parallelism off)")


def tp_plan(model: nn.Module, *, sequence_parallel: bool = False,
            user_plan: Mapping[str, str] | None = None) -> dict[str, ParallelStyle]:
    """The tensor-parallel plan of `model`: module path ("" = the model itself) -> its
    ParallelStyle. What `apply_tp` applies, what the memory estimate reads
    (`param_shard_dims`) and what the checks hold the model to (`check_user_plan`): one place
    decides the shards. `user_plan` (model.tp_plan) non-empty: that plan (parallel.tp_user),
    for any model; else the built-in one of trainlab's and Hugging Face Llama-family blocks."""
    if user_plan:
        return user_tp_plan(model, user_plan)
    # Layout of the residual stream between the sharded matmuls: sequence-sharded
    # activations under sequence parallelism, full replicated ones otherwise.
    residual = Shard(1) if sequence_parallel else Replicate()
    norm_style = SequenceParallel if sequence_parallel else _Replicated

    ends = {
        # Vocab-sharded rows: each rank looks up its rows, the partial sums are reduced.
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=residual),
        "norm": norm_style(),
        # Full logits on every rank (all-gather over the vocab): no loss parallelism.
        "output": ColwiseParallel(input_layouts=residual, output_layouts=Replicate(),
                                  use_local_output=True),
    }
    # A pipeline stage lacks some ends (None) and holds its blocks in an nn.ModuleDict.
    plan = {k: v for k, v in ends.items() if getattr(model, k, None) is not None}
    names = block_names(model)
    if names.attention_input:  # the block calls its attention with keywords (transformers)
        attention_input = PrepareModuleInput(
            input_kwarg_layouts={names.attention_input: residual},
            desired_input_kwarg_layouts={names.attention_input: Replicate()})
    else:  # (x, cos, sin): only x is distributed; the rotary tables stay plain tensors.
        attention_input = PrepareModuleInput(input_layouts=(residual, None, None),
                                             desired_input_layouts=(Replicate(), None, None))
    for key, _ in model.layers.named_children():
        block = {
            names.attention_norm: norm_style(),
            names.attention: attention_input,
            names.q: ColwiseParallel(),
            names.k: ColwiseParallel(),
            names.v: ColwiseParallel(),
            names.o: RowwiseParallel(output_layouts=residual),
            names.mlp_norm: norm_style(),
            names.mlp: PrepareModuleInput(input_layouts=(residual,), desired_input_layouts=(Replicate(),)),
            names.gate: ColwiseParallel(),
            names.down: RowwiseParallel(output_layouts=residual),
            names.up: ColwiseParallel(),
        }
        plan.update({f"layers.{key}.{child}": style for child, style in block.items()})
    return plan


def check_user_plan(model: nn.Module, user_plan: Mapping[str, str], tp: int, *, seq_len: int = 0) -> None:
    """Refuse a model.tp_plan that `apply_tp` cannot apply to `model` `tp` ways: an unknown
    style, a pattern matching no module or a module that is not an nn.Linear, a module it
    cannot replicate, a colwise out_features or rowwise in_features `tp` does not divide; with
    `seq_len` (train.seq_len), a plan whose shards do not fit together on one rank (a query
    sharded while keys and values stay whole: parallel.tp_shapes, on the meta device).

    Raises:
        ValueError: naming model.tp_plan, the module and what to change.
    """
    check_divisible(model, tp_plan(model, user_plan=user_plan), tp)
    if seq_len:
        check_plan_shapes(model, user_plan, tp, seq_len=seq_len)


def param_shard_dims(model: nn.Module, *, sequence_parallel: bool = False,
                     user_plan: Mapping[str, str] | None = None) -> dict[str, int]:
    """Parameter name (as model.named_parameters()) -> the dim `apply_tp` shards it on; a
    parameter not named is replicated. torch's styles: ColwiseParallel shards a Linear's
    weight and bias on dim 0 (output features) and an Embedding's weight on dim 1;
    RowwiseParallel a Linear's weight on dim 1 (its bias is replicated) and an Embedding's
    weight on dim 0 (rows of the vocabulary)."""
    dims: dict[str, int] = {}
    for name, style in tp_plan(model, sequence_parallel=sequence_parallel, user_plan=user_plan).items():
        module = model.get_submodule(name)
        embedding = isinstance(module, nn.Embedding)
        if isinstance(style, ColwiseParallel):
            dims[f"{name}.weight"] = 1 if embedding else 0
            if getattr(module, "bias", None) is not None:
                dims[f"{name}.bias"] = 0
        elif isinstance(style, RowwiseParallel):
            dims[f"{name}.weight"] = 0 if embedding else 1
    return dims


def apply_tp(model: nn.Module, *, mesh: DeviceMesh, sequence_parallel: bool = False,
             user_plan: Mapping[str, str] | None = None) -> nn.Module:
    """Shard `model` in place over the 1-D tensor-parallel `mesh` and return it, by the
    built-in plan or, when given, `user_plan` (model.tp_plan; parallel.tp_user).

    Apply before data parallelism / FSDP, which must see the DTensor parameters made here.
    Call with the same model (same seed or weights) on every rank of `mesh`: the sharded
    and the replicated-norm weights are taken from the mesh's first rank, but the
    sequence-parallel norms keep each rank's own (torch assumes they are identical).

    Raises:
        ValueError: a multi-dimensional mesh, or a model `check_tp` (`check_user_plan` for a
            user plan) refuses.
    """
    if mesh.ndim != 1:
        raise ValueError(f"apply_tp needs the 1-D tensor-parallel mesh (e.g. world_mesh['tp']), "
                         f"got a {mesh.ndim}-D mesh {mesh.mesh_dim_names}")
    if user_plan and sequence_parallel:
        raise ValueError(SEQUENCE_PARALLEL_WITH_PLAN)
    plan = tp_plan(model, sequence_parallel=sequence_parallel, user_plan=user_plan)
    if user_plan:
        check_divisible(model, plan, mesh.size())  # check_user_plan's checks, on the plan applied
    else:
        check_tp(model.args, mesh.size())
    if sequence_parallel:
        # SequenceParallel takes each rank's local activations as equal slices of the
        # sequence; an uneven split would desynchronise the collectives (gloo aborts,
        # NCCL hangs), so refuse it before any of them runs.
        model.register_forward_pre_hook(partial(_check_seq_len, tp=mesh.size()))
    return parallelize_module(model, mesh, plan)


SEQUENCE_PARALLEL_WITH_PLAN = (
    "parallel.sequence_parallel=true with model.tp_plan: a plan from config passes plain, replicated "
    "activations between modules and has no sequence-sharded norms; set parallel.sequence_parallel=false")


def clip_grads_with_norm_(params: list[torch.Tensor], max_norm: float, total_norm: torch.Tensor) -> None:
    """torch.nn.utils.clip_grads_with_norm_ (scale every gradient by max_norm / total_norm when
    that is below 1), except that gradients held as Partial DTensors are scaled one by one.

    Under tensor parallelism the replicated norms' gradients come back Partial (one addend per
    rank). torch 2.11's in-place foreach multiply, which clip_grads_with_norm_ uses, leaves a
    Partial DTensor unscaled (checked with two gloo ranks: [Shard, Partial] * 0.5 scales only
    the Shard one; 2.13 scales both); a per-tensor mul_ scales it on both."""
    one_by_one, rest = [], []
    for p in params:
        if p.grad is not None:
            partial = isinstance(p.grad, DTensor) and any(pl.is_partial() for pl in p.grad.placements)
            (one_by_one if partial else rest).append(p)
    if rest:
        torch.nn.utils.clip_grads_with_norm_(rest, max_norm, total_norm)
    if one_by_one:
        torch.nn.utils.clip_grads_with_norm_(one_by_one, max_norm, total_norm, foreach=False)


__all__ = ["SEQUENCE_PARALLEL_WITH_PLAN", "apply_tp", "check_tp", "check_user_plan", "clip_grads_with_norm_",
           "param_shard_dims", "tp_plan"]
