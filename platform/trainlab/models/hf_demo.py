"""A tiny Hugging Face model made here, for the README's demo and the tests: nothing downloads.

    write_demo_model("demo/llama", family="llama", vocab_size=512)   # config.json + model.safetensors

Two decoder layers of width 64, saved with transformers' own ``save_pretrained``, so
``AutoModelForCausalLM.from_pretrained(DIR)`` loads it and ``model.pretrained=DIR`` fine-tunes it.
"""

from __future__ import annotations

from pathlib import Path

import torch

DEMO_DIMS = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.02)
"""Two layers of width 64 (the test model's size): grouped-query attention, 4 heads over 2 kv heads."""


def demo_config(family: str, *, vocab_size: int, **overrides):
    """transformers' config of the demo model of `family` (llama, mistral, qwen2, qwen3; gpt_neox, gemma,
    phi: models.hf_any)."""
    from trainlab.models.hf import quiet_transformers

    quiet_transformers()
    from transformers import AutoConfig

    dims = {**DEMO_DIMS, "vocab_size": vocab_size, "tie_word_embeddings": False, **overrides}
    if family in ("qwen3", "gemma"):
        dims.setdefault("head_dim", 16)  # their defaults (128, 256) are not width / heads
    if family == "gpt_neox":
        dims.pop("num_key_value_heads")  # multi-head attention only
    return AutoConfig.for_model(family, **dims)


def write_demo_model(out_dir: str | Path, *, family: str = "llama", vocab_size: int, seed: int = 0,
                     **overrides) -> Path:
    """Save a randomly initialised demo model of `family` to `out_dir` (save_pretrained's layout:
    config.json, generation_config.json, model.safetensors); returns the folder."""
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(demo_config(family, vocab_size=vocab_size, **overrides),
                                             dtype=torch.float32, trust_remote_code=False)
    model.save_pretrained(out)
    return out


__all__ = ["DEMO_DIMS", "demo_config", "write_demo_model"]
