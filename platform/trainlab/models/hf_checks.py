"""A model=hf folder checked on the driver before Ray starts, in a time that does not grow with its depth.

    check_hf_model(run.model)      # launch.preflight.check_data: ValueError naming the field and the fix

What every worker would otherwise fail on, after the cluster started: transformers' config
(models.hf_config_file: no code of the folder runs, its keys' types, its activation); the
architecture (a model_type transformers cannot build, no list of decoder layers); and for
model.pretrained the weights, from the safetensors headers alone (config.safetensors_header:
not cut short or damaged) against the shapes the config makes, tensor by tensor. The model is
built on the meta device with its first SHALLOW_LAYERS decoder layers only; the Llama family's
layers are alike, so every layer of the checkpoint is checked against the first one's shapes.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from trainlab.config.hf_model import own_loop, read_hf_dims
from trainlab.config.safetensors_header import TensorEntry
from trainlab.config.schema import ModelConfig
from trainlab.models.init import model_roots

SHALLOW_LAYERS = 2
"""Decoder layers the driver's checks build: two show what one layer is and how layers are named."""

LOADED_DTYPES = ("F32", "BF16", "F16", "F64")
"""Stored dtypes of a weight the load casts into a parameter (a quantized or integer tensor is no weight)."""


def check_hf_model(cfg: ModelConfig) -> None:
    """model=hf's config, architecture and (model.pretrained) weights, as the workers will meet them;
    ValueError naming the field, what is wrong and the fix."""
    from trainlab.models.hf import hf_config

    hf_config(cfg)  # its refusals are one line already: no code run, strict keys, activation
    model = shallow_model(cfg)
    if cfg.pretrained:
        check_weights(cfg, model)


def shallow_model(cfg: ModelConfig) -> nn.Module:
    """model=hf's model with its first SHALLOW_LAYERS decoder layers, on the meta device; what
    transformers cannot build is refused naming the field."""
    from trainlab.models.hf import build_hf_model

    value, field = cfg.hf_source()
    try:
        with torch.device("meta"):
            return build_hf_model(cfg, vocab_size=cfg.vocab_size, num_layers=SHALLOW_LAYERS)
    except (KeyError, ValueError, TypeError, AttributeError, IndexError) as e:
        reason = (str(e).splitlines() or [type(e).__name__])[0][:300]
        if reason.startswith(f"{field}="):
            raise
        if "decoder layers" in reason or "output head" in reason:
            raise ValueError(f"{field}={value!r}: {reason}") from None
        raise ValueError(f"{field}={value!r}: transformers cannot build a causal LM from its config.json ({reason}); "
                         "point it at a config of an architecture AutoModelForCausalLM knows") from None


def expected_tensors(cfg: ModelConfig, model: nn.Module):
    """(checkpoint key, shape) of every tensor the load reads, as `model` (shallow_model's) names
    them. The Llama family: every layer, each shaped as the first; another family: the layers
    built (its layers may differ from one another: a mixture of experts after dense layers)."""
    every_layer = own_loop(cfg.hf_model_type())
    for root in model_roots(model):
        for name, p in root.named_parameters():
            layer = re.match(r"layers\.(\d+)\.(.*)", name)
            if layer and every_layer:
                if layer.group(1) == "0":
                    for i in range(cfg.n_layers):
                        yield root.checkpoint_key(f"layers.{i}.{layer.group(2)}"), tuple(p.shape)
                continue
            yield root.checkpoint_key(name), tuple(p.shape)


def check_weights(cfg: ModelConfig, model: nn.Module) -> None:
    """Every tensor model.pretrained's load reads is in its safetensors, stored as a float, shaped as
    its config.json makes it."""
    from trainlab.models.hf_weights import checkpoint_tensors

    field, value = "model.pretrained", cfg.pretrained
    stored = checkpoint_tensors(value, field=field)
    again = (f"point {field} at the folder these weights were saved in with their own config.json, or edit its "
             "config.json to match them")
    for key, shape in expected_tensors(cfg, model):
        entry = stored.get(key)
        if entry is None:
            raise ValueError(f"{field}={value!r}: its weights hold no tensor {key}, which the model its config.json "
                             f"describes needs ({_layers(cfg, stored)}); {again}")
        if entry.dtype not in LOADED_DTYPES:
            raise ValueError(f"{field}={value!r}: {entry.file} stores {key} as {entry.dtype}; trainlab loads weights "
                             f"stored as {', '.join(LOADED_DTYPES)}: save the model unquantized (save_pretrained of "
                             "a float model) and set it to that folder")
        if entry.shape != shape:
            raise ValueError(f"{field}={value!r}: {entry.file} holds {key} as {list(entry.shape)}, but its "
                             f"config.json ({_dims(cfg)}) makes it {list(shape)}; {again}")


def _layers(cfg: ModelConfig, stored: dict[str, TensorEntry]) -> str:
    found = {int(m.group(1)) for k in stored if (m := re.search(r"\.layers\.(\d+)\.", k))}
    held = f"the weights hold {max(found) + 1} decoder layers" if found else "the weights hold no decoder layers"
    return f"num_hidden_layers={cfg.n_layers}; {held}"


def _dims(cfg: ModelConfig) -> str:
    d = read_hf_dims(*cfg.hf_source())
    return (f"hidden_size={d.dim}, num_attention_heads={d.n_heads}, num_key_value_heads={d.n_kv_heads}, "
            f"head_dim={d.head_dim}, intermediate_size={d.ffn_dim}, vocab_size={d.vocab_size}")


__all__ = ["LOADED_DTYPES", "SHALLOW_LAYERS", "check_hf_model", "check_weights", "expected_tensors", "shallow_model"]
