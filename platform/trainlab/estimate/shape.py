"""The model as the time estimate sees it: matmul sizes per block, which linears run in low precision.

    shape = model_shape(run)
    hp, lowp, attention = shape.flops_per_token(blocks=[0, 1], head=True, seq_len=2048, checkpoint="none")

Counted from the same ModelArgs the engine builds (models.args.resolve_dims) and the same layer
policy the precision recipe applies (precision.policy.plan_layers on a meta-device model: no
memory, exact names and shapes), so an FP8 trial's FP8 share is the one it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainlab.config.schema import RunConfig
from trainlab.data.build_corpus import corpus_vocab_size
from trainlab.models.accounting import block_param_count
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


def model_shape(run: RunConfig) -> ModelShape:
    if run.model._target_:
        raise NotImplementedError(
            f"model._target_={run.model._target_!r}: trainlab estimates its presets and Hugging Face models "
            "(model=hf), whose shapes it knows; your own module is trained unestimated")
    if run.model.runs_transformers_forward():
        raise NotImplementedError(
            f"a {run.model.hf_model_type()} model: trainlab estimates its presets and the Llama-family Hugging "
            "Face models (llama, mistral, qwen2, qwen3), whose blocks it knows; this family is trained unestimated")
    args = resolve_dims(run.model, vocab_size=corpus_vocab_size(run.data))
    d, hd = args.dim, args.head_dim
    linear = d * args.n_heads * hd * 2 + 2 * d * args.n_kv_heads * hd + 3 * d * args.ffn_dim
    spec = spec_of(run.precision.name)
    lowp = [0] * args.n_layers
    head_lowp = False
    if spec.low_precision_layers:
        lowp, head_lowp = _lowp_weights(run, args)
    return ModelShape(args=args, block_linear=linear, block_params=block_param_count(args), lowp=tuple(lowp),
                      head_lowp=head_lowp)


def _lowp_weights(run: RunConfig, args: ModelArgs) -> tuple[list[int], bool]:
    import torch

    from trainlab.models import build_model
    from trainlab.precision.policy import plan_layers

    with torch.device("meta"):  # the model the engine builds, with its own module names (model=hf)
        model = build_model(run.model, vocab_size=args.vocab_size)
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
