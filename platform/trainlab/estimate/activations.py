"""Modelled memory of one rank: activations saved for backward, and transient buffers.

    act = rank_activations(run, model=model, recipe=recipe, rank=r, device_type="cuda")
    act.activations, act.buffers       # bytes at the step's peak

Activations, per micro-batch and block, are the tensors autograd keeps of the Llama block
in models.transformer (per token; D dim, F ffn_dim, H heads, `a` bytes of the compute dtype):
- each RMSNorm, computed in float32: its float32 input and normalised output (2 x 4D);
- the inputs of the linears: one tensor per autocast cast (wq, wk, wv each cast the norm's
  output: 3 x aD; w1, w3: 2 x aD), one shared tensor without autocast;
- attention: SDPA's q, k, v (k and v repeated to H heads) and output, its log-sum-exp
  (float32 per head), and wo's contiguous input: 5aD + 4H;
- SwiGLU: w1 and w3 outputs, silu's output and the product: 4aF.
Tensor parallel divides the sharded part (attention and MLP) by tp; sequence parallel also
the norms' and the linears' inputs. A checkpointed block keeps only its input (the residual
stream) until backward recomputes it, so one block's full activations come back at a time.
Pipelines hold several micro-batches at once: GPipe all m, 1F1B pp - stage, interleaved 1F1B
torch's warm-up count (schedules._get_warmup_ops) of chunks, plus the one in flight.

Buffers: the logits in the compute dtype and float32 (the loss upcasts), the float32 log-softmax
cross-entropy keeps, and the logits' gradient in float32 at the start of backward; FSDP2's
all-gathered (unsharded) parameters in param_dtype, of the block being computed and the one
prefetched (ZeRO-2: every block stays gathered from forward to backward; the root never
reshards) and the block's unsharded gradient before its reduce-scatter; DDP's gradient
buckets (a flat copy of every gradient); a pipeline's flat all-reduce of its gradients; FP8
linears' saved float8 copies of their weights per micro-batch in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from trainlab.config import RunConfig
from trainlab.config.layout_types import TrialLayout, coords
from trainlab.estimate.shards import Sharding, rank_shards, stage_modules

F32 = 4


@dataclass(frozen=True)
class Activations:
    activations: int
    buffers: int


def compute_bytes(run: RunConfig, *, model: nn.Module, recipe) -> int:
    """Bytes per element of the activations: 2 under bf16/fp16 autocast or bf16 parameters,
    4 in fp32 and where casts are emulated in float32 (fp16 on CPU; emulated formats)."""
    if any(p.dtype == torch.bfloat16 for p in model.parameters()):
        return 2
    from trainlab.vocab.precision import spec_of

    spec = spec_of(run.precision.name)
    dtype = spec.matmul_dtype(run.precision.hp_dtype)
    if spec.name == "fp16" and recipe.emulated:
        return F32
    return 2 if dtype in ("bf16", "fp16") else F32


def autocasts(run: RunConfig, *, model: nn.Module, recipe) -> bool:
    """Whether linears cast their inputs themselves (torch.autocast active around forward)."""
    return compute_bytes(run, model=model, recipe=recipe) == 2 and not any(
        p.dtype == torch.bfloat16 for p in model.parameters())


def block_bytes(run: RunConfig, *, model: nn.Module, recipe, tokens: int) -> tuple[int, int]:
    """(bytes one block keeps for backward, bytes of its input alone: what a checkpointed
    block keeps) for `tokens` tokens of one micro-batch on one rank."""
    par = run.parallel
    tp = max(1, par.tp) if par.pp == 1 else 1
    sp = tp if par.sequence_parallel else 1
    a = compute_bytes(run, model=model, recipe=recipe)
    cast = autocasts(run, model=model, recipe=recipe)
    args = model.args
    d, f, h = args.dim, args.ffn_dim, args.n_heads
    norms = 2 * 2 * F32 * d
    inputs = (3 + 2 if cast else 2) * a * d
    sharded = 4 * a * d + F32 * h + 4 * a * f
    bf16_params = any(p.dtype == torch.bfloat16 for p in model.parameters())
    residual = (2 if bf16_params else F32) * d
    per_token = (norms + inputs) / sp + sharded / tp
    per_block = _weight_casts(model, recipe, cast=cast) / tp
    if bf16_params:  # apply_rope's float32 copies of the bf16 cos/sin tables, for q and for k
        per_block += 4 * F32 * run.train.seq_len * args.head_dim
    if getattr(recipe, "emulated", False) and run.precision.name == "fp16":
        per_token += 4 * F32 * d  # measured: the emulated casts' float32 rounded operands
    return int(tokens * per_token + per_block), int(tokens * residual / sp)


def _weight_casts(model: nn.Module, recipe, *, cast: bool) -> int:
    """Bytes of one block's weights as its linears save them for backward, when they are
    copies: autocast's low-precision casts (2 bytes), FP8 linears' float8 casts (1 byte),
    emulated fp16's float32 rounded copies (4 bytes). Plain fp32 and bf16 parameters are
    saved as themselves (no copy)."""
    block = model.blocks()[0]
    lowp = {n.split(".", 2)[2] for n in (recipe.plan.lowp if recipe.plan is not None else ())
            if n.startswith("layers.0.")}
    run_fp8 = getattr(recipe, "all_gather", None) is not None  # an Fp8Recipe
    total = 0
    for name, module in block.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        n = module.weight.numel()
        if run_fp8 and name in lowp:
            total += n
        elif cast:
            total += 2 * n
        elif getattr(recipe, "emulated", False) and recipe.name == "fp16":
            total += F32 * n
    return total


def checkpointed(run: RunConfig, block_index: int) -> bool:
    """Whether parallel.activation_checkpoint recomputes block `block_index` (of the full model)."""
    from trainlab.parallel.activation_checkpoint import SELECTIVE_EVERY

    mode = run.parallel.activation_checkpoint
    return mode == "block" or (mode == "selective" and block_index % SELECTIVE_EVERY == SELECTIVE_EVERY - 1)


def in_flight(run: RunConfig, *, pp_rank: int, trial_layout: TrialLayout) -> tuple[int, int]:
    """(micro-batches whose activations a pipeline rank holds at its peak, in chunks of one
    stage; stages per rank). Without a pipeline: one micro-batch (accumulation frees each
    micro-batch's activations in its backward)."""
    layout = Sharding.of(run, trial_layout)
    pp, v = layout.dims.pp, layout.virtual_stages
    if pp == 1:
        return 1, 1
    m = layout.pp_microbatches
    schedule = run.parallel.pp_schedule
    if schedule == "gpipe":
        return m, 1
    if schedule == "1f1b":
        return min(m, pp - pp_rank), 1
    rounds = max(1, m // pp)
    per_round = m // rounds
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - pp_rank), m * v)
    return min(warmup + 1, m * v), v


def micro_batch(run: RunConfig, *, trial_layout: TrialLayout) -> int:
    """Sequences of one micro-batch: train.micro_batch_size, or a pipeline's batch over its m."""
    layout = Sharding.of(run, trial_layout)
    if layout.dims.pp == 1:
        return run.train.micro_batch_size
    return run.train.global_batch_size // layout.dims.dp // layout.pp_microbatches


def rank_activations(run: RunConfig, *, model: nn.Module, recipe, rank: int, device_type: str,
                     trial_layout: TrialLayout, sequences: int | None = None) -> Activations:
    """`sequences`: this rank's micro-batch where it is not the config's (a weighted split)."""
    layout = Sharding.of(run, trial_layout)
    at = coords(rank, layout.dims)
    a = compute_bytes(run, model=model, recipe=recipe)
    tokens = (sequences or micro_batch(run, trial_layout=trial_layout)) * run.train.seq_len
    full, kept = block_bytes(run, model=model, recipe=recipe, tokens=tokens)
    parts = stage_modules(model, layout, at.pp_rank)
    chunks, stages = in_flight(run, pp_rank=at.pp_rank, trial_layout=trial_layout)
    # one stage's saved activations per micro-batch, the stages of this rank alike in depth
    per_stage = []
    for part in parts:
        indices = [int(k) for k, _ in part.layers.named_children()]
        saved = sum(kept if checkpointed(run, i) else full for i in indices)
        per_stage.append(saved)
    per_chunk = max(per_stage)
    acts = per_chunk * chunks  # interleaved: chunks count (stage, micro-batch) pairs
    if run.parallel.activation_checkpoint != "none":
        acts += full  # the block being recomputed in backward
    shards = rank_shards(model, run, rank=rank, trial_layout=trial_layout)
    grads = sum(s.grad_nbytes for s in shards)
    vocab = model.args.vocab_size
    holds_head = any(getattr(part, "output", None) is not None for part in parts)
    logits = tokens * vocab * (a + 3 * F32) if holds_head else 0
    buffers = logits + _comm_buffers(run, model=model, layout=layout, grads=grads, rank=rank)
    if layout.dims.pp > 1:
        # the activation a stage sends/receives per micro-batch in flight: [mb, T, D]
        buffers += 2 * tokens * model.args.dim * a
    return Activations(activations=int(acts), buffers=int(buffers))


def _comm_buffers(run: RunConfig, *, model: nn.Module, layout: Sharding, grads: int, rank: int) -> int:
    if layout.dims.dp == 1 and layout.dims.tp == 1:
        return 0
    if layout.fsdp:
        from trainlab.vocab.precision import spec_of

        spec = spec_of(run.precision.name)
        pdt = spec.fsdp_param_dtype(run.precision.hp_dtype, emulated=False)
        blocks = list(model.blocks())
        block_numel = sum(p.numel() for p in blocks[0].parameters()) // max(1, layout.dims.tp)
        root_numel = sum(p.numel() for p in model.parameters()) // max(1, layout.dims.tp) - block_numel * len(blocks)
        pbytes = pdt.itemsize if pdt is not None else next(model.parameters()).dtype.itemsize
        gathered = len(blocks) if run.parallel.data_parallel == "zero2" else 2
        grad_bytes = next(model.parameters()).dtype.itemsize
        return (gathered * block_numel + root_numel) * pbytes + block_numel * grad_bytes
    if layout.dims.pp > 1:
        return grads  # allreduce_grads' flat copy
    if layout.dims.tp > 1 and layout.dims.dp > 1:
        return grads // max(1, len(list(model.blocks())))  # replicate reduces per block
    if layout.dims.dp > 1:
        return grads  # DDP's buckets: a flat copy of every gradient
    return 0


__all__ = ["Activations", "block_bytes", "in_flight", "rank_activations"]
