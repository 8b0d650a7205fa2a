"""model=hf: a Hugging Face causal LM's dimensions, read once from its config.json.

    dims = read_hf_dims("/models/llama-1b", field="model.pretrained")   # -> HFDims
    ModelConfig(name="hf", pretrained="/models/llama-1b")                 # fills dim, n_layers, ...

The config layer reads the JSON itself (no transformers import), so everything that plans a
trial from `run.model` (pipeline depth, tensor-parallel heads, the context check, the memory
and time estimates, MLflow's params) sees the Hugging Face model's true shape, decided here and
nowhere else. Nothing downloads: a hub name ('meta-llama/Llama-3.2-1B') that is not a local
folder is refused with the local folder to use, the hub cache's snapshot when there is one.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from trainlab.vocab.files import CONFIG_FILE_MAX_BYTES, read_text
from trainlab.vocab.hub import hub_refusal, looks_like_hub_name

HF_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
"""Hugging Face model types trainlab runs with its own decoder loop (pipeline stages, tensor
parallel plan, per-block sharding), each checked equal to transformers' forward in tests."""

TESTED_OTHER_FAMILIES = ("gpt_neox", "gemma", "phi")
"""Other model types the tests train (models.hf_any: transformers' own forward, sharded per
decoder layer; no pipeline split, tensor parallel through model.tp_plan). Any other
AutoModelForCausalLM architecture whose config.json names its width, depth and heads takes the
same path."""

_ALIASES = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions"),
    "norm_eps": ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"),
}
"""config.json keys of the same dimension across transformers' architectures (GPT-2's n_embd...)."""


def own_loop(model_type: str) -> bool:
    """Whether trainlab runs `model_type` with its own decoder loop (models.hf) rather than
    transformers' forward (models.hf_any)."""
    return model_type in HF_FAMILIES


@dataclass(frozen=True)
class HFDims:
    """What trainlab's planning needs of a Hugging Face config: the ModelConfig fields it fills."""

    model_type: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    max_seq_len: int
    rope_theta: float
    norm_eps: float
    init_std: float
    qkv_bias: bool
    tie_embeddings: bool
    sliding_window: int
    """Tokens a sliding-window layer attends to; 0 = every layer attends to the whole context."""

    def model_fields(self) -> list[str]:
        """The ModelConfig fields these dims fill (each named as there): all but model_type."""
        return [f.name for f in dataclasses.fields(self) if f.name != "model_type"]


def local_folder(value: str, *, field: str, example: str = "") -> Path:
    """The local folder `value` names, or a ValueError naming `field`: a hub name with no local
    path (nothing downloads: vocab.hub says which local copy to use), a path that does not exist
    or is not a folder."""
    path = Path(os.path.expanduser(value))
    if path.is_dir():
        return path
    if not path.exists() and looks_like_hub_name(value):
        raise ValueError(hub_refusal(field, value, repo_type="model"))
    if not path.exists():
        raise ValueError(f"{field}={value!r} does not exist; set {field} to a local folder{example}")
    raise ValueError(f"{field}={value!r} is not a folder; set {field} to the folder that holds config.json"
                     f"{example}")


def config_json_path(value: str, field: str) -> Path:
    """model.config may name a config.json (or any .json) or the folder that holds one."""
    path = Path(os.path.expanduser(value))
    if path.suffix == ".json" and path.exists():
        return path
    return local_folder(value, field=field) / "config.json"


def read_hf_dims(value: str, field: str) -> HFDims:
    """The dims of the Hugging Face config `value` names (model.config or model.pretrained)."""
    path = config_json_path(value, field=field)
    st = os.stat(path) if path.exists() else None
    return _read_dims(str(path), field, st.st_mtime_ns if st else 0, st.st_size if st else 0)


@lru_cache(maxsize=32)
def _read_dims(path: str, field: str, _mtime_ns: int, _size: int) -> HFDims:
    # keyed by the file's identity: a config rewritten in place is read again
    text = read_text(path, field=field, max_bytes=CONFIG_FILE_MAX_BYTES,
                     fix=f"set {field} to a folder saved by transformers' save_pretrained (it holds config.json)")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{field}: {path} is not JSON ({e.msg} at line {e.lineno}); "
                         "point it at a transformers config.json") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{field}: {path} holds a JSON {type(raw).__name__}, not a config object; "
                         "point it at a transformers config.json")
    return _dims(raw, path=path, field=field)


def _dims(raw: dict, *, path: str, field: str) -> HFDims:
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(f"{field}: {path} has no model_type; point it at a config.json saved by transformers "
                         "(save_pretrained writes model_type)")

    def lookup(key: str, default=None):
        return next((raw[k] for k in _ALIASES.get(key, (key,)) if raw.get(k) is not None), default)

    def need(key: str, kind=int):
        value = lookup(key)
        if not isinstance(value, kind) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{field}: {path} has {key}={value!r}; a {model_type} config needs a positive "
                             f"{kind.__name__} {key}")
        return value

    dim, n_heads = need("hidden_size"), need("num_attention_heads")
    n_kv = raw.get("num_key_value_heads") or n_heads
    head_dim = raw.get("head_dim") or dim // n_heads
    ffn_dim = lookup("intermediate_size") or 4 * dim  # GPT-2's n_inner=null: four times the width
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = raw.get("rope_theta", rope.get("rope_theta", 10000.0) if isinstance(rope, dict) else 10000.0)
    window = raw.get("sliding_window") or 0
    uses_window = (model_type == "mistral" and window) or (raw.get("use_sliding_window") and window)
    return HFDims(
        model_type=model_type, dim=dim, n_layers=need("num_hidden_layers"), n_heads=n_heads,
        n_kv_heads=int(n_kv), head_dim=int(head_dim), ffn_dim=int(ffn_dim),
        vocab_size=need("vocab_size"), max_seq_len=int(lookup("max_position_embeddings") or 2048),
        rope_theta=float(theta),
        norm_eps=float(lookup("norm_eps", 1e-6)),
        init_std=float(raw.get("initializer_range", 0.02)),
        qkv_bias=bool(raw.get("attention_bias", model_type == "qwen2")),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        sliding_window=int(window) if uses_window else 0,
    )


__all__ = ["HF_FAMILIES", "TESTED_OTHER_FAMILIES", "HFDims", "config_json_path", "local_folder", "own_loop", "read_hf_dims"]
