"""Resolved model dimensions: `ModelConfig` with its "0 = derive" sentinels filled in.

`ModelConfig` is what a user writes; `ModelArgs` is what the model is built from. Keeping
them apart means the model code never sees a sentinel and the derivation rules live in
one place (:func:`resolve_dims`), shared by the builder, the parameter count and the
FLOP count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainlab.config.schema import ModelConfig
from trainlab.config.validate import check_model_vocab


@dataclass(frozen=True)
class ModelArgs:
    """Every dimension of a `Transformer`, all explicit (no sentinels)."""

    dim: int
    """Width of the residual stream."""
    n_layers: int
    """Number of transformer blocks."""
    n_heads: int
    """Query heads."""
    n_kv_heads: int
    """Key/value heads; divides n_heads (== n_heads for plain multi-head attention)."""
    head_dim: int
    """Width of one head; n_heads * head_dim == dim, except in Hugging Face models that set it (Qwen3)."""
    ffn_dim: int
    """Hidden width of the SwiGLU MLP."""
    vocab_size: int
    """Rows of the embedding and columns of the output head."""
    max_seq_len: int
    """Longest sequence the rotary table covers."""
    rope_theta: float = 10000.0
    """Rotary base frequency."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    init_std: float = 0.02
    """Std of the normal init of linear and embedding weights."""
    smooth_swiglu: bool = False
    """Smooth-SwiGLU: per-channel power-of-2 scaling around the MLP down projection."""
    qkv_bias: bool = False
    """The query/key/value projections have biases (a Hugging Face Qwen2)."""
    tie_embeddings: bool = False
    """The output head is the token embedding's weight (one tensor, counted once)."""
    hf_family: str = ""
    """model=hf: the Hugging Face model_type (llama, qwen2, ...); "" = trainlab's own Transformer."""

    def __post_init__(self) -> None:
        # Users reach this only through resolve_dims, whose input ModelConfig already
        # validated these; a failure here is a bug in the caller, not a config error.
        assert min(self.dim, self.n_layers, self.n_heads, self.n_kv_heads, self.head_dim,
                   self.ffn_dim, self.vocab_size, self.max_seq_len) > 0, self
        assert self.n_heads % self.n_kv_heads == 0, self
        assert self.head_dim % 2 == 0, self

    @property
    def n_rep(self) -> int:
        """Query heads sharing one key/value head (1 = plain multi-head attention)."""
        return self.n_heads // self.n_kv_heads


def derive_ffn_dim(dim: int, *, multiple_of: int) -> int:
    """SwiGLU hidden width: 8/3 * dim rounded up to a multiple of `multiple_of`.

    SwiGLU has three matrices instead of two, so 8/3 * dim keeps the MLP's parameter count
    equal to a classic 4 * dim GELU MLP (Shazeer 2020, as in Llama).
    """
    # Integer ceil(8 * dim / (3 * multiple_of)): no float rounding surprises at any width.
    return -(-8 * dim // (3 * multiple_of)) * multiple_of


def _as_model_config(cfg: Any) -> ModelConfig:
    # Hydra hands over a DictConfig whose ModelConfig.__post_init__ has not run yet
    # (it runs only in OmegaConf.to_object); convert so its checks always apply.
    if isinstance(cfg, ModelConfig):
        return cfg
    if isinstance(cfg, DictConfig):
        obj = OmegaConf.to_object(cfg)
        if isinstance(obj, ModelConfig):
            return obj
        cfg = obj
    if isinstance(cfg, dict):
        return ModelConfig(**{k: v for k, v in cfg.items() if k != "defaults"})
    raise TypeError(f"expected a ModelConfig, got {type(cfg).__name__}")


def resolve_dims(cfg: ModelConfig, *, vocab_size: int) -> ModelArgs:
    """Turn a `ModelConfig` into explicit `ModelArgs`.

    Args:
        cfg: the `model` section of the run config (a ModelConfig, or a DictConfig/dict
            of one).
        vocab_size: the corpus's vocabulary size (tokens are ids in [0, vocab_size)).
            ``cfg.vocab_size == 0`` takes it as is; a larger ``cfg.vocab_size`` pads the
            embedding (e.g. to a multiple of 64 for faster matmuls); a smaller one is an
            error, because token ids would index past the embedding.

    Raises:
        ValueError: vocab_size <= 0, or 0 < cfg.vocab_size < vocab_size.
    """
    cfg = _as_model_config(cfg)
    if vocab_size <= 0:
        raise ValueError(
            f"the corpus vocabulary size is {vocab_size}; it must be positive "
            "(check data.vocab_size)"
        )
    check_model_vocab(cfg.vocab_size, vocab_size)  # the config layer's check (config.validate)
    n_heads = cfg.n_heads
    return ModelArgs(
        dim=cfg.dim,
        n_layers=cfg.n_layers,
        n_heads=n_heads,
        n_kv_heads=cfg.n_kv_heads or n_heads,
        head_dim=cfg.head_dim or cfg.dim // n_heads,
        ffn_dim=cfg.ffn_dim or derive_ffn_dim(cfg.dim, multiple_of=cfg.multiple_of),
        vocab_size=cfg.vocab_size or vocab_size,
        max_seq_len=cfg.max_seq_len,
        rope_theta=float(cfg.rope_theta),
        norm_eps=float(cfg.norm_eps),
        init_std=float(cfg.init_std),
        smooth_swiglu=bool(cfg.smooth_swiglu),
        qkv_bias=bool(cfg.qkv_bias),
        tie_embeddings=bool(cfg.tie_embeddings),
        hf_family=_hf_family(cfg),
    )


def _hf_family(cfg: ModelConfig) -> str:
    if cfg.name != "hf":
        return ""
    from trainlab.config.hf_model import read_hf_dims

    return read_hf_dims(*cfg.hf_source()).model_type
