"""Parameter and FLOP counts, for sizing presets and for MFU.

Counts are analytic (from `ModelArgs`, no tensors) so the sizes of models too large for
this machine are still exact; `num_params` counts a live (or meta-device) module and the
tests check that the two agree.
"""

from __future__ import annotations

from torch import nn

from trainlab.config.hf_model import own_loop
from trainlab.models.args import ModelArgs, resolve_dims


def count_params(args: ModelArgs, *, exclude_embedding: bool = False) -> int:
    """Parameters of a `Transformer` built from `args`, counted from its dimensions.

    exclude_embedding drops the input token embedding (V * D) only: a lookup costs no
    FLOPs. The output head (D * V) stays: it is a matmul like any other.
    """
    embedding = 0 if exclude_embedding or args.tie_embeddings else args.vocab_size * args.dim
    # a tied head is the embedding's tensor: counted once, as the head (its matmul costs FLOPs)
    return embedding + args.n_layers * block_param_count(args) + args.dim + args.dim * args.vocab_size


def block_param_count(args: ModelArgs) -> int:
    """Parameters of one decoder block: attention, SwiGLU MLP, its two norms (and Qwen2's
    query/key/value biases, Qwen3's per-head query/key norms)."""
    d, hd = args.dim, args.head_dim
    attention = d * args.n_heads * hd + 2 * d * args.n_kv_heads * hd + args.n_heads * hd * d
    if args.qkv_bias:
        attention += (args.n_heads + 2 * args.n_kv_heads) * hd
    if args.hf_family == "qwen3":
        attention += 2 * hd  # q_norm, k_norm: one RMSNorm gain per head width
    return attention + 3 * d * args.ffn_dim + 2 * d


def num_params(model: nn.Module, *, exclude_embedding: bool = False) -> int:
    """Parameters of `model` (shared tensors once); works through a DDP wrapper.

    exclude_embedding drops the weights of every `nn.Embedding` (the token embedding).
    """
    total = sum(p.numel() for p in model.parameters())
    if exclude_embedding:
        total -= sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Embedding))
    return total


def flops_per_token(args: ModelArgs, *, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token, for MFU.

        6 * N + 12 * n_layers * dim * seq_len

    N is the parameter count without the token embedding (a tied head still counts). Every weight does one
    multiply-add (2 FLOPs) per token forward and two backward (input and weight
    gradients): 6 * N. Attention's QK^T and AV matmuls add 2 * 2 * T * D per layer per
    token forward, 3x that for training: 12 * L * D * T. This is the PaLM (Chowdhery et
    al. 2022, app. B) / torchtitan convention: it counts the full T x T score matrix,
    although causal attention needs only half, and ignores norms, softmax and rotary
    (elementwise, negligible). Hardware FLOPs with activation recomputation would be
    higher; this is model FLOPs, as MFU defines it.
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len={seq_len} must be positive (train.seq_len)")
    n = count_params(args, exclude_embedding=True)
    # the attention width is n_heads * head_dim (= dim, except where a config sets head_dim)
    return float(6 * n + 12 * args.n_layers * args.n_heads * args.head_dim * seq_len)


def matmul_params(model: nn.Module) -> int:
    """The parameters MFU's 6N counts in a model of another Hugging Face family (models.hf_any): all
    but the token embedding (a lookup); a head tied to it still counts (its matmul costs FLOPs)."""
    tied = model.get_submodule("output").weight is model.get_input_embeddings_weight()
    return num_params(model, exclude_embedding=not tied)


def custom_flops_per_token(params: int) -> float:
    """model=custom's training FLOPs per token: 6 x its parameters without the token embedding,
    counted on the module itself. Its attention's score matmuls are not counted (trainlab cannot
    see their width), so its MFU is a lower bound."""
    return float(6 * params)


def model_flops_per_token(cfg, model: nn.Module, *, vocab_size: int, seq_len: int) -> float:
    """MFU's FLOPs per token of `model`, built from the `model` config section `cfg`: from its
    dimensions (flops_per_token), or for model=custom from the module's own parameters
    (custom_flops_per_token; count it before a layout shards or splits it)."""
    if cfg._target_:
        return custom_flops_per_token(num_params(model, exclude_embedding=True))
    args = resolve_dims(cfg, vocab_size=vocab_size)
    if args.hf_family and not own_loop(args.hf_family):
        # another family's blocks are its own (biases, a 2-matrix MLP, fused q/k/v): count the module's
        # parameters, and its attention from the config's heads as flops_per_token does
        return float(6 * matmul_params(model) + 12 * args.n_layers * args.n_heads * args.head_dim * seq_len)
    return flops_per_token(args, seq_len=seq_len)
