"""transformers' config of a model=hf folder, read with none of the folder's own code run.

    config = load_hf_config(Path("/models/llama-1b/config.json"), field="model.pretrained", value="/models/llama-1b")

A config.json may name code to run (``auto_map``: its own config and model classes, in .py files
beside it). transformers asks on the terminal whether to run it ("Do you wish to run the custom
code? [y/N]") unless told; trainlab tells it never (trust_remote_code=False everywhere it calls
transformers) and refuses such a folder itself first, in one line, so no prompt appears and no
code of the folder runs. What transformers' own config classes reject (a key of the wrong type:
they are strict dataclasses) and a hidden_act it has no function for are one line each too,
naming config.json's key, its value and the fix, where transformers would fail in every worker
with a traceback.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from trainlab.vocab.files import CONFIG_FILE_MAX_BYTES, read_text

ACTIVATION_KEYS = ("hidden_act", "hidden_activation", "activation_function")
"""config.json keys naming the MLP's activation across transformers' families (GPT-2's
activation_function, Gemma's hidden_activation), each looked up in transformers' ACT2FN."""


def load_hf_config(path: Path, *, field: str, value: str):
    """transformers' config read from `path` (a config.json), never from the hub and never running
    code from the folder; ValueError naming `field`=`value`, the key and the fix for a config
    transformers cannot build a model from."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    where = f"{field}={value!r}"
    raw = json.loads(read_text(path, field=field, fix=f"set {field} to a folder holding a config.json",
                               max_bytes=CONFIG_FILE_MAX_BYTES))  # read and checked once already: config.hf_model
    model_type = raw.get("model_type")
    if model_type not in CONFIG_MAPPING_NAMES:
        if "auto_map" in raw:
            named = ", ".join(sorted({str(v) for v in _flat(raw["auto_map"])}))[:200]
            raise ValueError(
                f"{where}: {path} names model_type={model_type!r}, which transformers does not ship, and an "
                f"auto_map to code in the folder ({named}); trainlab never runs a model folder's own code: "
                f"point {field} at a model of an architecture transformers ships (llama, mistral, qwen2, ...)")
        raise ValueError(f"{where}: transformers cannot build a causal LM from its config.json (model_type="
                         f"{model_type!r} is not an architecture it knows); point it at a config of an architecture "
                         "AutoModelForCausalLM knows")
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - whatever transformers raises for a config it cannot read
        raise ValueError(_config_refusal(e, raw, where=where, path=path)) from None
    check_activation(config, raw, where=where, path=path)
    return config


def _flat(value) -> list:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _flat(v)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _flat(v)]
    return [value]


def _config_refusal(e: Exception, raw: dict, *, where: str, path: Path) -> str:
    """One line for transformers' refusal of a config.json: a strict config's field named with its
    value as the file writes it."""
    text = str(e)
    strict = re.match(r"Validation error for field '([^']+)':\s*(.*)", text, flags=re.S)
    if strict:
        key, cause = strict.group(1), " ".join(strict.group(2).split())
        shown = json.dumps(raw[key], allow_nan=True)[:60] if key in raw else "(absent)"
        return (f"{where}: {path} has {key}={shown}, which transformers rejects ({cause[:200]}); edit it there, "
                "or remove the key to take transformers' default")
    reason = " ".join(text.split())[:300]
    return (f"{where}: transformers cannot read its config.json ({type(e).__name__}: {reason}); fix {path} or point "
            "it at a folder saved by transformers' save_pretrained")


def check_activation(config, raw: dict, *, where: str, path: Path) -> None:
    """The MLP's activation (hidden_act and its aliases) is one transformers has a function for."""
    from transformers.activations import ACT2FN

    for key in ACTIVATION_KEYS:
        act = getattr(config, key, None)
        if act is None or (isinstance(act, str) and act in ACT2FN):
            continue
        shown = json.dumps(raw.get(key, act), allow_nan=True)[:60]
        raise ValueError(f"{where}: {path} has {key}={shown}, an activation transformers does not know; edit it "
                         f"there to one it does: {', '.join(sorted(ACT2FN))}")


__all__ = ["ACTIVATION_KEYS", "check_activation", "load_hf_config"]
