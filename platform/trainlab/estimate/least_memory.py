"""The least memory a trial can take, from its config's arithmetic alone: nothing is built.

    least = least_memory(run, trial_layout=plan_layout(run))   # LeastMemory(params, state, activations)
    least.total > cluster memory   ->   no layout of it fits: refused before anything builds the model

The estimate (estimate.memory_model) counts each rank's shards on the model built on the meta
device: exact, but building a 100,000-layer config takes minutes. This is a lower bound of the
estimate's sum over every rank, by the estimate's own rules with every unknown taken at its least:
- parameters counted from the dimensions (models.accounting; a family outside the Llama family:
  its attention projections and embedding alone, a sure undercount), each stored once over the
  cluster (sharding spreads, never removes) with its gradient and AdamW's two moments, each in the
  least dtype the precision and optim.* can give it (bf16 parameters only under bf16_pure);
- activations: every decoder layer keeps, for one micro-batch of every data-parallel replica, at
  least its input (a checkpointed block) or the Llama block's saved tensors at 2 bytes a value
  (estimate.activations), scaled by cluster.calibration's activation factor.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainlab.config.layout_types import TrialLayout
from trainlab.config.schema import RunConfig
from trainlab.vocab.precision import spec_of

F32 = 4


@dataclass(frozen=True)
class LeastMemory:
    params: int
    """Parameters, counted from the dimensions (a lower bound outside the Llama family)."""
    state: int
    """Bytes of parameters, gradients and optimizer state, over the whole cluster."""
    activations: int
    """Bytes of activations, over the whole cluster."""

    @property
    def total(self) -> int:
        return self.state + self.activations


def least_params(run: RunConfig) -> int:
    """The model's parameters from its dimensions: exact for trainlab's presets and the Llama family,
    a lower bound for any other Hugging Face family (no MLP, one vocabulary matrix)."""
    from trainlab.models.accounting import count_params

    args = _args(run)
    if not run.model.runs_transformers_forward():
        return count_params(args)
    d, hd = args.dim, args.head_dim
    return args.n_layers * (2 * d * args.n_heads * hd + 2 * d * args.n_kv_heads * hd) + args.vocab_size * d


def _args(run: RunConfig):
    from trainlab.data.build_corpus import corpus_vocab_size
    from trainlab.models.args import resolve_dims

    return resolve_dims(run.model, vocab_size=corpus_vocab_size(run.data))


def least_memory(run: RunConfig, *, trial_layout: TrialLayout, activation_factor: float = 1.0) -> LeastMemory:
    """The least bytes `run` takes over all its ranks under `trial_layout` (plan.derive_layout)."""
    from trainlab.estimate.activations import micro_batch
    from trainlab.parallel.activation_checkpoint import SELECTIVE_EVERY
    from trainlab.precision.lowp_adamw import STATE_DTYPES

    spec = spec_of(run.precision.name)
    p = 2 if spec.low_precision_params else F32
    moments = sum(min(p, STATE_DTYPES[d].itemsize) for d in (run.optim.exp_avg_dtype, run.optim.exp_avg_sq_dtype))
    params = least_params(run)
    state = params * (2 * p + moments)

    args, t = _args(run), run.train
    a = 2 if p == 2 or spec.matmul_dtype(run.precision.hp_dtype) in ("bf16", "fp16") else F32
    d, h, f = args.dim, args.n_heads, args.ffn_dim
    full = 2 * 2 * F32 * d + 2 * a * d + 4 * a * d + F32 * h + 4 * a * f  # per token (estimate.activations)
    kept = p * d  # a checkpointed block's input: the residual stream
    mode = run.parallel.activation_checkpoint
    n_kept = args.n_layers if mode == "block" else args.n_layers // SELECTIVE_EVERY if mode == "selective" else 0
    sequences = micro_batch(run, trial_layout=trial_layout) if run.parallel.dp_balance == "equal" else 1
    tokens = sequences * t.seq_len * trial_layout.dims.dp
    acts = tokens * (n_kept * kept + (args.n_layers - n_kept) * full)
    return LeastMemory(params=params, state=state, activations=int(acts * activation_factor))


__all__ = ["LeastMemory", "least_memory", "least_params"]
