"""A Llama-style decoder-only transformer.

Pre-norm blocks (RMSNorm), rotary position embeddings, grouped-query attention through
``F.scaled_dot_product_attention`` and a SwiGLU MLP; untied output head, no biases.

Shape legend: B batch, T sequence length, D model width (``dim``), H query heads,
K key/value heads, Dh head width, F MLP hidden width, V vocabulary.

The model is a plain ``nn.Module`` with no distributed code: the engine wraps it (DDP).
Nothing in ``forward`` mutates module state, so it is safe under ``torch.compile`` and
DDP; dtype handling is local (RMSNorm and rotary run in float32, then cast back), so the
same code serves fp32, autocast (bf16/fp16) and a model cast to bf16 entirely.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainlab.models.args import ModelArgs
from trainlab.models.init import Fill, fill_parameter, normal, ones


# ---------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned per-channel gain (no bias, no mean removal).

    Computes in float32 and returns the input dtype: the mean of squares of bf16/fp16
    activations loses too much precision (and can overflow in fp16) otherwise.
    """

    def __init__(self, dim: int, *, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., D] -> [..., D], same dtype as x."""
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


# ---------------------------------------------------------------------------------------
def rope_tables(*, head_dim: int, max_seq_len: int, theta: float,
                device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and sine tables of the rotary embedding, float32, each [max_seq_len, Dh].

    Channel i of the first half and channel i of the second half form one rotation pair
    (the "rotate half" / GPT-NeoX layout), turned by angle pos * theta^(-2i/Dh). Real
    tables instead of complex ``freqs_cis``: complex tensors do not survive bf16/fp16
    autocast, ``model.to(bf16)`` or DDP buffer broadcast cleanly.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device,
                                             dtype=torch.float32) / head_dim))
    pos = torch.arange(max_seq_len, device=device, dtype=torch.float32)
    angles = torch.outer(pos, inv_freq)            # [T, Dh/2]
    angles = torch.cat((angles, angles), dim=-1)   # [T, Dh]: the same angle for both halves
    return angles.cos(), angles.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the last dim's two halves."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate queries or keys by position.

    x: [B, heads, T, Dh]; cos, sin: [T, Dh]. Returns x's shape and dtype. Computed in
    float32 so the rotation stays accurate when x is bf16/fp16.
    """
    xf = x.float()
    out = xf * cos.float() + _rotate_half(xf) * sin.float()
    return out.to(x.dtype)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, K, T, Dh] -> [B, K * n_rep, T, Dh]; query head h reads kv head h // n_rep."""
    if n_rep == 1:
        return x
    b, k, t, d = x.shape
    return x[:, :, None].expand(b, k, n_rep, t, d).reshape(b, k * n_rep, t, d)


# ---------------------------------------------------------------------------------------
class Attention(nn.Module):
    """Causal multi-head attention with grouped key/value heads and rotary positions."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [B, T, D]; cos, sin: [T, Dh] -> [B, T, D]."""
        b, t, _ = x.shape
        # [B, T, heads * Dh] -> [B, heads, T, Dh], the layout SDPA expects. Head counts come
        # from the projections' outputs (-1), not from self.n_heads: under tensor parallelism
        # wq/wk/wv are column-sharded and each rank holds only its H/tp and K/tp heads.
        q = self.wq(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # H / K, the same on a shard: query head h reads kv head h // n_rep locally too.
        n_rep = self.n_heads // self.n_kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, Dh]
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(w1 x) * w3 x).

    ``swiglu_tap`` is an identity on the SwiGLU output h = silu(w1 x) * w3 x (the input of
    the down projection, before any smoothing): telemetry hooks it without touching the
    math. With ``smooth=True`` (Smooth-SwiGLU, Fishman et al., ICLR 2025) the down
    projection sees diag(s) h with the weight w2 diag(1/s), s from `smooth_scales`:
    the same function, but the activation a low-precision w2 casts is free of the outlier
    channels that aligned w1/w3 rows create late in training. The channel's range moves
    into w2's column c (times amax_c): a per-tensor weight cast gains where that column is
    small, as in a network whose output is not dominated by its outlier channel.
    """

    def __init__(self, *, dim: int, hidden_dim: int, smooth: bool = False) -> None:
        super().__init__()
        self.smooth = smooth
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)  # gate
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)  # down projection
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)  # up projection
        self.swiglu_tap = nn.Identity()

    @staticmethod
    def smooth_scales(h: torch.Tensor) -> torch.Tensor:
        """Smooth-SwiGLU factors: per channel of h's last dim, s = 2^-ceil(log2(amax)).

        amax is over every token of the current h (detached: s is a constant to autograd), so
        |h * s| lies in (0.5, 1] per channel. Powers of 2 because multiplying and dividing by
        them is exact: the smoothed MLP is the same function, bit for bit up to matmul order.
        A channel that is all zero (or non-finite) gets 1, and the exponent is clamped to half
        the format's range so neither h * s nor w2 / s can overflow (fp16: s in [2^-7, 2^7]).
        Returns float32 [F].
        """
        amax = h.detach().abs().amax(dim=tuple(range(h.dim() - 1))).float()
        amax = torch.where((amax > 0) & amax.isfinite(), amax, torch.ones_like(amax))
        limit = float(int(math.log2(torch.finfo(h.dtype).max)) // 2)
        return torch.exp2(-torch.ceil(torch.log2(amax)).clamp(-limit, limit))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, T, D] -> [B, T, D]."""
        h = self.swiglu_tap(F.silu(self.w1(x)) * self.w3(x))  # [B, T, F]
        if not self.smooth:
            return self.w2(h)
        s = self.smooth_scales(h)
        # Call the module itself with a substituted weight rather than F.linear: w2 may
        # be an FP8 module (torchao Float8Linear, a delayed-scaling nn.Linear subclass, a
        # linear with an emulating forward), and it is w2's own forward that must cast
        # diag(s) h. The gradient reaches w2.weight through the division.
        weight = self.w2.weight
        return torch.func.functional_call(
            self.w2, {"weight": weight / s.to(weight.dtype)}, (h * s.to(h.dtype),))


class TransformerBlock(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then h + mlp(norm(h))."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(dim=args.dim, hidden_dim=args.ffn_dim,
                                        smooth=args.smooth_swiglu)
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [B, T, D]; cos, sin: [T, Dh] -> [B, T, D]."""
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


# ---------------------------------------------------------------------------------------
class Transformer(nn.Module):
    """Decoder-only language model: tokens [B, T] -> next-token logits [B, T, V].

    Build with :func:`trainlab.models.build_model` from a config, or directly from
    resolved `ModelArgs`. The constructor initializes the weights (see `init_weights`) from
    torch's global RNG, so a model built after ``torch.manual_seed(s)`` is a deterministic
    function of s. Built under ``torch.device("meta")`` it holds shapes only: shard or split
    it, then `trainlab.models.init.materialize` gives it storage and the weights of
    ``init_weights(seed=...)``, the same whatever the layout.
    """

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        # Non-persistent: derived from args, so checkpoints stay free of them and loading
        # one never overwrites the tables with stale values. They are float32 unless the
        # whole model is cast (model.to(bf16) rounds them to bf16: fine for training,
        # the rotation error is then on the order of bf16 rounding of q and k themselves).
        cos, sin = self._rope_tables(device=None)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if not self.rope_cos.is_meta:
            self.init_weights()

    def _rope_tables(self, *, device: torch.device | None) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_tables(head_dim=self.args.head_dim, max_seq_len=self.args.max_seq_len,
                           theta=self.args.rope_theta, device=device)

    @torch.no_grad()
    def init_weights(self, *, seed: int | None = None) -> None:
        """(Re)initialize every parameter and the rotary tables.

        Linear and embedding weights ~ N(0, init_std); the projections that write into
        the residual stream (attention ``wo``, MLP ``w2``) ~ N(0, init_std / sqrt(2 *
        n_layers)) so the residual's variance stays O(1) however deep the model (GPT-2).
        RMSNorm gains = 1. Each parameter's values come from a generator seeded by (seed, its
        name) (`trainlab.models.init`), so a sharded parameter or a pipeline stage (whose
        blocks keep the full model's names) gets exactly its part of the one-process model.
        seed None: drawn from torch's global RNG.
        """
        if seed is None:
            seed = int(torch.randint(0, 2**62, (), device="cpu"))
        fills = self._param_fills()
        for name, param in self.named_parameters():
            fill_parameter(param, fills[name], seed=seed, name=name)
        self.init_buffers()

    def _param_fills(self) -> dict[str, Fill]:
        """How each parameter starts (`init_weights`), by the module that owns it."""
        std = self.args.init_std
        out_std = std / math.sqrt(2 * self.args.n_layers)
        to_residual = {id(m) for b in self.blocks() for m in (b.attention.wo, b.feed_forward.w2)}
        fills: dict[str, Fill] = {}
        for prefix, module in self.named_modules():
            for pname, _ in module.named_parameters(recurse=False):
                if isinstance(module, RMSNorm):
                    fill = ones()
                else:
                    assert isinstance(module, (nn.Linear, nn.Embedding)), (
                        f"no init rule for the parameters of {type(module).__name__} ({prefix})")
                    fill = normal(out_std if id(module) in to_residual else std)
                fills[f"{prefix}.{pname}" if prefix else pname] = fill
        return fills

    @torch.no_grad()
    def init_buffers(self) -> None:
        """Recompute the rotary tables in place, on their current device and dtype."""
        cos, sin = self._rope_tables(device=self.rope_cos.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def blocks(self) -> list[TransformerBlock]:
        """The blocks in order: all of them, or a pipeline stage's share of them.

        A pipeline stage (`trainlab.parallel.pp.split_stages`) holds its blocks in an
        ``nn.ModuleDict`` keyed by their index in the full model, so its parameter names
        (``layers.<i>.…``) are the full model's; the full model keeps its ``nn.ModuleList``.
        """
        if isinstance(self.layers, nn.ModuleDict):
            return list(self.layers.values())
        return list(self.layers)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: int64 [B, T] with T <= max_seq_len -> logits [B, T, V].

        Logits are in the compute dtype (bf16 under bf16 autocast); upcast before the loss.
        A pipeline stage lacks some ends: without ``tok_embeddings`` it takes the previous
        stage's hidden state [B, T, D] instead of tokens, and without ``norm`` / ``output``
        it returns its hidden state [B, T, D] instead of logits.
        """
        t = tokens.shape[1]
        assert t <= self.args.max_seq_len, (
            f"sequence length {t} exceeds model.max_seq_len={self.args.max_seq_len}")
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.blocks():
            h = layer(h, cos, sin)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h
