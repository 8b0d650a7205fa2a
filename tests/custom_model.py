"""A model of a user's own for model=custom tests: a small GPT (learned positions, LayerNorm,
GELU MLP, biases), nothing like trainlab's Llama, built by `build` from the model.* fields its
signature names; `build_split` gives it separate q, k, v projections, so that a tensor-parallel
plan (model.tp_plan, TP_PLAN) can shard its attention by heads too."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

TP_PLAN = {"layers.*.q": "colwise", "layers.*.k": "colwise", "layers.*.v": "colwise", "layers.*.proj": "rowwise",
           "layers.*.fc": "colwise", "layers.*.out": "rowwise"}
"""model.tp_plan for `build_split`'s names: heads and MLP channels sharded, the rest replicated."""


class Block(nn.Module):
    def __init__(self, dim: int, n_heads: int, *, split_qkv: bool = False) -> None:
        super().__init__()
        self.n_heads, self.split_qkv = n_heads, split_qkv
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        if split_qkv:
            self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        else:
            self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        head = d // self.n_heads
        h = self.ln_1(x)
        if self.split_qkv:  # -1 heads: under tensor parallelism a rank holds n_heads / tp of them
            q, k, v = (f(h).view(b, t, -1, head).transpose(1, 2) for f in (self.q, self.k, self.v))
        else:
            q, k, v = self.qkv(h).view(b, t, 3, self.n_heads, head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        x = x + self.proj(y.reshape(b, t, -1))
        return x + self.out(F.gelu(self.fc(self.ln_2(x))))


class TinyGPT(nn.Module):
    def __init__(self, *, vocab_size: int, dim: int, n_layers: int, n_heads: int, max_seq_len: int,
                 split_qkv: bool = False) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, dim), nn.Embedding(max_seq_len, dim)
        self.layers = nn.ModuleList(Block(dim, n_heads, split_qkv=split_qkv) for _ in range(n_layers))
        self.ln_f, self.lm_head = nn.LayerNorm(dim), nn.Linear(dim, vocab_size, bias=False)

    def forward(self, tokens):
        # wpe called, not wpe.weight sliced: under model.tp_plan a parameter is a DTensor outside its module's call
        h = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.layers:
            h = block(h)
        return self.lm_head(self.ln_f(h))


def build(vocab_size: int, dim: int, n_layers: int, n_heads: int, max_seq_len: int) -> TinyGPT:
    return TinyGPT(vocab_size=vocab_size, dim=dim, n_layers=n_layers, n_heads=n_heads, max_seq_len=max_seq_len)


def build_split(vocab_size: int, dim: int, n_layers: int, n_heads: int, max_seq_len: int) -> TinyGPT:
    return TinyGPT(vocab_size=vocab_size, dim=dim, n_layers=n_layers, n_heads=n_heads, max_seq_len=max_seq_len,
                   split_qkv=True)


def not_a_module(vocab_size: int):
    return {"vocab_size": vocab_size}


def no_blocks(vocab_size: int) -> nn.Module:
    return nn.Sequential(nn.Embedding(vocab_size, 8), nn.Linear(8, vocab_size))
