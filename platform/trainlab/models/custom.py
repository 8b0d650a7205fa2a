"""model=custom: your own nn.Module from a builder named by model._target_ (Hydra's convention).

    def build(vocab_size: int, dim: int, n_layers: int) -> nn.Module: ...   # my_models.py
    trainlab train model=custom model._target_=my_models.build model.dim=256

The builder is called with the model.* fields its signature names (all of them if it takes
**kwargs); `vocab_size` is the corpus's when model.vocab_size is 0. What it returns must map
tokens [B, T] to logits [B, T, V] and hold its blocks in `.layers` (an nn.ModuleList): FSDP2
shards one group per block, activation checkpointing and compile work per block, the precision
recipes convert its nn.Linear layers by name. A module that defines `init_weights(seed=...)` is
built on the meta device and materialised like the presets; any other is built for real on every
rank from the run's seed (the same weights everywhere).
"""

from __future__ import annotations

import dataclasses
import inspect

import torch
from torch import nn

from trainlab.config.schema import ModelConfig

NOT_ARGUMENTS = ("name", "_target_", "config", "pretrained", "tp_plan")


def locate(target: str):
    """The callable `target` names; ValueError naming model._target_ and the fix."""
    from hydra.utils import get_object

    try:
        found = get_object(target)
    except Exception as e:  # noqa: BLE001 - Hydra's locate raises ImportError or a wrapped one
        raise ValueError(f"model._target_={target!r} cannot be imported ({str(e).splitlines()[0][:200]}); "
                         "name a function as package.module.function, on PYTHONPATH where trainlab runs") from None
    if not callable(found):
        raise ValueError(f"model._target_={target!r} is a {type(found).__name__}, not a function; name the function "
                         "that returns your nn.Module")
    return found


def builder_kwargs(build, cfg: ModelConfig, *, vocab_size: int) -> dict:
    """The model.* fields `build`'s signature takes (every field for **kwargs)."""
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in NOT_ARGUMENTS}
    fields["vocab_size"] = cfg.vocab_size or vocab_size
    params = inspect.signature(build).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fields
    return {k: v for k, v in fields.items() if k in params}


def build_custom(cfg: ModelConfig, *, vocab_size: int, shapes_only: bool = False) -> nn.Module:
    """Your module, checked to have blocks in `.layers`; on the meta device only when it can
    initialise itself there (init_weights) or only its names and shapes are read (`shapes_only`),
    else on the CPU with torch's global RNG."""
    build = locate(cfg._target_)
    kwargs = builder_kwargs(build, cfg, vocab_size=vocab_size)
    model = build(**kwargs)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model._target_={cfg._target_!r} returned a {type(model).__name__}, not an nn.Module")
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise ValueError(f"model._target_={cfg._target_!r} returned a {type(model).__name__} without blocks in "
                         "`.layers`; keep your blocks in an nn.ModuleList named layers (FSDP, activation "
                         "checkpointing and compile work per block)")
    on_meta = any(p.is_meta for p in model.parameters())
    if on_meta and not shapes_only and not callable(getattr(model, "init_weights", None)):
        with torch.device("cpu"):  # it cannot initialise itself after a meta build: build it for real
            model = build(**kwargs)
    return model


def is_custom(cfg: ModelConfig) -> bool:
    return bool(cfg._target_)


__all__ = ["build_custom", "builder_kwargs", "is_custom", "locate"]
