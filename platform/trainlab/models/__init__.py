"""Model zoo: a Llama-style decoder, its config resolution and its size/FLOP accounting.

    model = build_model(cfg.model, vocab_size=corpus.vocab_size)
    flops = flops_per_token(model.args, seq_len=cfg.train.seq_len)   # for MFU

Presets live in ``conf/model/`` (tiny, small, 125m, 350m, 1b, 7b).
"""

from trainlab.models.accounting import count_params, flops_per_token, num_params
from trainlab.models.args import ModelArgs, derive_ffn_dim, resolve_dims
from trainlab.models.build_model import build_model
from trainlab.models.transformer import (
    Attention,
    FeedForward,
    RMSNorm,
    Transformer,
    TransformerBlock,
)

__all__ = [
    "Attention",
    "FeedForward",
    "ModelArgs",
    "RMSNorm",
    "Transformer",
    "TransformerBlock",
    "build_model",
    "count_params",
    "derive_ffn_dim",
    "flops_per_token",
    "num_params",
    "resolve_dims",
]
