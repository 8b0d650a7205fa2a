"""What each part of a decoder block is called in one model class: read by the layers that
cut a block by role (the tensor-parallel plan, SwiGLU telemetry), so a Hugging Face model's
own names (``self_attn.q_proj``) and trainlab's (``attention.wq``) need no second plan."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockNames:
    """Submodule paths inside one decoder block, by role."""

    attention_norm: str
    attention: str
    q: str
    k: str
    v: str
    o: str
    mlp_norm: str
    mlp: str
    gate: str
    """SwiGLU's gated projection (silu applied): w1 / gate_proj."""
    up: str
    """SwiGLU's linear projection: w3 / up_proj."""
    down: str
    """The projection back into the residual stream: w2 / down_proj."""
    attention_input: str = ""
    """The keyword the block passes the attention's input under ("" = first positional)."""


TRAINLAB_BLOCK = BlockNames(
    attention_norm="attention_norm", attention="attention", q="attention.wq", k="attention.wk",
    v="attention.wv", o="attention.wo", mlp_norm="ffn_norm", mlp="feed_forward", gate="feed_forward.w1",
    up="feed_forward.w3", down="feed_forward.w2")
HF_LLAMA_BLOCK = BlockNames(
    attention_norm="input_layernorm", attention="self_attn", q="self_attn.q_proj", k="self_attn.k_proj",
    v="self_attn.v_proj", o="self_attn.o_proj", mlp_norm="post_attention_layernorm", mlp="mlp",
    gate="mlp.gate_proj", up="mlp.up_proj", down="mlp.down_proj", attention_input="hidden_states")
"""transformers' LlamaDecoderLayer and its copies (Mistral, Qwen2, Qwen3)."""


def block_names(model) -> BlockNames:
    """The block names of `model` (a Transformer, an HFCausalLM or a stage of either)."""
    return getattr(model, "block_names", TRAINLAB_BLOCK)


__all__ = ["HF_LLAMA_BLOCK", "TRAINLAB_BLOCK", "BlockNames", "block_names"]
