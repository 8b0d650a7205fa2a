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
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from trainlab.config.bounds import INT64_MAX
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


HF_KEY_OF = {"n_layers": "num_hidden_layers", "dim": "hidden_size", "n_heads": "num_attention_heads",
             "n_kv_heads": "num_key_value_heads", "ffn_dim": "intermediate_size", "head_dim": "head_dim",
             "max_seq_len": "max_position_embeddings", "vocab_size": "vocab_size"}
"""The config.json key that sets each ModelConfig field of model=hf."""


def change_model_field(field: str, *, hf: bool) -> str:
    """The fix 'change model.<field>' as it works: for model=hf, its config.json's key, which
    overrides model.* (setting the field itself would change nothing)."""
    if hf:
        return f"use a config.json with another {HF_KEY_OF[field]} (model=hf takes model.{field} from it)"
    return f"change model.{field}"


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
    keys = ConfigKeys(raw, path=path, field=field)
    dim, n_heads = keys.positive_int("hidden_size"), keys.positive_int("num_attention_heads")
    n_kv = keys.positive_int("num_key_value_heads", default=n_heads)  # null: transformers' n_heads too
    if dim % n_heads:  # ModelConfig's rule, said here in config.json's keys (it overrides model.*)
        keys.refuse(keys.spelt("hidden_size"), dim, f"a multiple of num_attention_heads={n_heads}")
    head_dim = keys.positive_int("head_dim", default=dim // n_heads)
    if n_heads % n_kv:
        keys.refuse("num_key_value_heads", n_kv, f"a divisor of num_attention_heads={n_heads} (whole query groups)")
    if head_dim % 2:
        given = keys.spelt("head_dim") in keys.raw
        keys.refuse("head_dim" if given else keys.spelt("hidden_size"), head_dim if given else dim,
                    "an even head width (rotary positions rotate pairs of channels)")
    rope = keys.section("rope_parameters") or keys.section("rope_scaling")
    theta = keys.number("rope_theta", gt=1, why="the rotary base", default=None)
    if theta is None:
        theta = ConfigKeys(rope, path=path, field=field, within="rope_parameters").number(
            "rope_theta", gt=1, why="the rotary base", default=10000.0)
    window = keys.positive_int("sliding_window", default=0, least=0)  # null or 0: no window
    uses_window = (model_type == "mistral" and window) or (keys.flag("use_sliding_window", False) and window)
    return HFDims(
        model_type=model_type, dim=dim, n_layers=keys.positive_int("num_hidden_layers"), n_heads=n_heads,
        n_kv_heads=n_kv, head_dim=head_dim,
        ffn_dim=keys.positive_int("intermediate_size", default=4 * dim),  # GPT-2's n_inner=null: 4 x width
        vocab_size=keys.positive_int("vocab_size"),
        max_seq_len=keys.positive_int("max_position_embeddings", default=2048),
        rope_theta=theta, norm_eps=keys.number("norm_eps", gt=0, why="the norms' epsilon", default=1e-6),
        init_std=keys.number("initializer_range", gt=0, why="the init's standard deviation", default=0.02),
        qkv_bias=keys.flag("attention_bias", model_type == "qwen2"),
        tie_embeddings=keys.flag("tie_word_embeddings", False),
        sliding_window=window if uses_window else 0,
    )


NULL_MEANS_DEFAULT = frozenset({"num_key_value_heads", "head_dim", "sliding_window", "n_inner", "rope_scaling",
                                "rope_parameters"})
"""Keys transformers itself reads a null as absent (its default: n_heads, width / heads, no window,
4 x width, no scaling); a null anywhere else fails in transformers' own config or model."""


class ConfigKeys:
    """config.json's values as trainlab reads them, each checked for its type and range: a bad one is
    one ValueError naming the file, the key, the value as written, and the fix (edit the key in the
    file, or remove it for transformers' default). The keys are config.json's own: for model=hf it
    overrides the model.* fields, so a fix naming those would not work."""

    def __init__(self, raw: dict, *, path: str, field: str, within: str = "") -> None:
        self.raw, self.path, self.field, self.within = raw, path, field, within

    def spelt(self, key: str) -> str:
        """`key` as this file spells it (GPT-2's n_embd for hidden_size)."""
        return self._get(key)[0]

    def _get(self, key: str) -> tuple[str, object]:
        """(the key as the file spells it, its value); (key, None) where absent."""
        return next(((k, self.raw[k]) for k in _ALIASES.get(key, (key,)) if k in self.raw), (key, None))

    def refuse(self, key: str, value: object, want: str, *, default_ok: bool = False) -> None:
        name = f"{self.within}.{key}" if self.within else key
        shown = json.dumps(value, allow_nan=True)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        fix = f"edit it there to {want}"
        if default_ok:
            fix += ", or remove the key to take transformers' default"
        raise ValueError(f"{self.field}: {self.path} has {name}={shown}; {fix}")

    def positive_int(self, key: str, *, default: int | None = None, least: int = 1) -> int:
        """A whole number from `least` (int64); `default` where absent (None: the key is required)."""
        name, value = self._get(key)
        if name not in self.raw or (value is None and name in NULL_MEANS_DEFAULT):
            if default is None:
                spelt = " or ".join(_ALIASES.get(key, (key,)))
                raise ValueError(f"{self.field}: {self.path} has no {spelt}; add {key} to it (a whole number "
                                 "above 0), or point it at a config.json saved by transformers")
            return default
        if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= INT64_MAX:
            self.refuse(name, value, f"a whole number of at least {least}", default_ok=default is not None)
        return value

    def number(self, key: str, *, gt: float, why: str, default: float | None) -> float | None:
        name, value = self._get(key)
        if name not in self.raw:
            return default
        if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
                or value <= gt):
            self.refuse(name, value, f"a number above {gt:g} ({why})", default_ok=True)
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        name, value = self._get(key)
        if name not in self.raw:
            return default
        if not isinstance(value, bool):
            self.refuse(name, value, "true or false", default_ok=True)
        return value

    def section(self, key: str) -> dict:
        value = self.raw.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.refuse(key, value, "an object ({...})", default_ok=True)
        return value


__all__ = ["HF_FAMILIES", "HF_KEY_OF", "TESTED_OTHER_FAMILIES", "HFDims", "change_model_field", "config_json_path",
           "local_folder", "own_loop", "read_hf_dims"]
