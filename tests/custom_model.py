"""A model of a user's own for model=custom tests: a small GPT (learned positions, LayerNorm,
GELU MLP, biases), nothing like trainlab's Llama, built by `build` from the model.* fields its
signature names."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln_1(x)).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln_2(x))))


class TinyGPT(nn.Module):
    def __init__(self, *, vocab_size: int, dim: int, n_layers: int, n_heads: int, max_seq_len: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, dim), nn.Embedding(max_seq_len, dim)
        self.layers = nn.ModuleList(Block(dim, n_heads) for _ in range(n_layers))
        self.ln_f, self.lm_head = nn.LayerNorm(dim), nn.Linear(dim, vocab_size, bias=False)

    def forward(self, tokens):
        h = self.wte(tokens) + self.wpe.weight[: tokens.shape[1]]
        for block in self.layers:
            h = block(h)
        return self.lm_head(self.ln_f(h))


def build(vocab_size: int, dim: int, n_layers: int, n_heads: int, max_seq_len: int) -> TinyGPT:
    return TinyGPT(vocab_size=vocab_size, dim=dim, n_layers=n_layers, n_heads=n_heads, max_seq_len=max_seq_len)


def not_a_module(vocab_size: int):
    return {"vocab_size": vocab_size}


def no_blocks(vocab_size: int) -> nn.Module:
    return nn.Sequential(nn.Embedding(vocab_size, 8), nn.Linear(8, vocab_size))
