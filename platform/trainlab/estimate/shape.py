"""The model as the time estimate sees it: matmul sizes per block, which linears run in low precision.

    shape = model_shape(run)
    hp, lowp, attention = shape.flops_per_token(blocks=[0, 1], head=True, seq_len=2048, checkpoint="none")

Counted from the same ModelArgs the engine builds (models.args.resolve_dims; a Hugging Face family
outside the Llama family: from its meta-device model) and the same layer
policy the precision recipe applies (precision.policy.plan_layers on a meta-device model: no
memory, exact names and shapes), so an FP8 trial's FP8 share is the one it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from trainlab.config.schema import RunConfig
from trainlab.data.build_corpus import corpus_vocab_size
from trainlab.models.accounting import block_param_count, count_params, matmul_params, num_params
from trainlab.models.args import ModelArgs, resolve_dims
from trainlab.vocab.precision import spec_of

RECOMPUTE = 4 / 3
"""A recomputed block costs one more forward: forward is 2 of training's 6 FLOPs per weight."""


@dataclass(frozen=True)
class ModelShape:
    args: ModelArgs
    block_linear: int
    """Weights of one block's linears (attention + SwiGLU MLP)."""
    block_params: int
    """All parameters of one block (linears + norms)."""
    lowp: tuple[int, ...]
    """Per block: weights of the linears that run in low precision (FP8 / emulated formats)."""
    head_lowp: bool
    """The output head runs in low precision (keep_hp without 'output')."""
    params: int
    """All parameters (a tied head once)."""
    flops_params: int
    """The parameters MFU's 6N counts: all but the token embedding (a tied head still counts)."""

    def model_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token as MFU counts them (models.accounting.flops_per_token's rule)."""
        a = self.args
        return float(6 * self.flops_params + 12 * a.n_layers * a.n_heads * a.head_dim * seq_len)

    @property
    def dim(self) -> int:
        return self.args.dim

    @property
    def n_layers(self) -> int:
        return self.args.n_layers

    def flops_per_token(self, *, blocks: list[int], head: bool, seq_len: int,
                        checkpoint: str) -> tuple[float, float, float]:
        """(high-precision linears, low-precision linears, attention) hardware FLOPs per token of
        `blocks` (+ the head), recomputation included."""
        hp = lowp = attention = 0.0
        for b in blocks:
            again = RECOMPUTE if checkpoint == "block" or (checkpoint == "selective" and b % 2 == 1) else 1.0
            hp += 6 * (self.block_linear - self.lowp[b]) * again
            lowp += 6 * self.lowp[b] * again
            attention += 12 * self.dim * seq_len * again
        if head:
            head_flops = 6 * self.dim * self.args.vocab_size
            lowp, hp = (lowp + head_flops, hp) if self.head_lowp else (lowp, hp + head_flops)
        return hp, lowp, attention

    def local_params(self, blocks: list[int], tp: int) -> int:
        """Parameters a rank holding `blocks` (1/tp of each) has before data-parallel sharding."""
        v_d = self.args.vocab_size * self.dim
        n = len(blocks) * self.block_params
        n += v_d if 0 in blocks else 0  # the embedding lives with the first stage
        n += v_d + self.dim if self.n_layers - 1 in blocks else 0  # head and final norm with the last
        return n // tp


def check_estimable(run: RunConfig) -> None:
    """NotImplementedError for a model whose shape trainlab does not know (model=custom)."""
    if run.model._target_:
        raise NotImplementedError(
            f"model._target_={run.model._target_!r}: trainlab estimates its presets and Hugging Face models "
            "(model=hf), whose shapes it knows; your own module is trained unestimated")


def model_shape(run: RunConfig) -> ModelShape:
    check_estimable(run)
    args = resolve_dims(run.model, vocab_size=corpus_vocab_size(run.data))
    spec = spec_of(run.precision.name)
    other_family = run.model.runs_transformers_forward()
    model = _meta_model(run, args) if spec.low_precision_layers or other_family else None
    lowp, head_lowp = _lowp_weights(run, args, model) if spec.low_precision_layers else ([0] * args.n_layers, False)
    if other_family:
        # another family's blocks (biases, a 2-matrix MLP, fused q/k/v): counted on the meta-device model
        # itself, every block as its first; activations keep the Llama-family formula (estimate.activations)
        block = model.layers[0]
        return ModelShape(
            args=args, block_linear=sum(m.weight.numel() for m in block.modules() if isinstance(m, nn.Linear)),
            block_params=num_params(block), lowp=tuple(lowp), head_lowp=head_lowp, params=num_params(model),
            flops_params=matmul_params(model))
    d, hd = args.dim, args.head_dim
    linear = d * args.n_heads * hd * 2 + 2 * d * args.n_kv_heads * hd + 3 * d * args.ffn_dim
    return ModelShape(args=args, block_linear=linear, block_params=block_param_count(args), lowp=tuple(lowp),
                      head_lowp=head_lowp, params=count_params(args),
                      flops_params=count_params(args, exclude_embedding=True))


def _meta_model(run: RunConfig, args: ModelArgs) -> nn.Module:
    """The model the engine builds, on the meta device: its own module names (model=hf), no memory."""
    from trainlab.models import build_model

    with torch.device("meta"):
        return build_model(run.model, vocab_size=args.vocab_size)


def _lowp_weights(run: RunConfig, args: ModelArgs, model: nn.Module) -> tuple[list[int], bool]:
    from trainlab.precision.policy import plan_layers

    spec = spec_of(run.precision.name)
    plan = plan_layers(model, list(run.precision.keep_hp or []), size_filter=spec.size_filter)
    modules = dict(model.named_modules())
    per_block = [0] * args.n_layers
    head = False
    for name in plan.lowp:
        if name.startswith("layers."):
            per_block[int(name.split(".")[1])] += modules[name].weight.numel()
        elif name == "output":
            head = True
    return per_block, head
