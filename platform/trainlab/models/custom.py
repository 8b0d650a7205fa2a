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
import importlib
import inspect
import os

import torch
from torch import nn

from trainlab.config.schema import ModelConfig

NOT_ARGUMENTS = ("name", "_target_", "config", "pretrained", "tp_plan")


def locate(target: str):
    """The callable `target` names, imported as Hydra's _target_ is (the longest importable module
    prefix, then attributes); ValueError naming model._target_, what went wrong and the fix: no such
    module, no such attribute, a module whose import raised, something that is not callable."""
    parts = target.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise ValueError(f"model._target_={target!r} is not a dotted path to a function; name your builder as "
                         "package.module.function, e.g. model._target_=my_models.build (my_models.py on PYTHONPATH)")
    module, i = None, len(parts) - 1
    while module is None:
        name = ".".join(parts[:i])
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and (name == e.name or name.startswith(e.name + ".")) and i > 1:
                i -= 1  # this prefix is no module (an attribute, or a missing package): a shorter one
                continue
            if e.name and (name == e.name or name.startswith(e.name + ".")):
                raise ValueError(f"model._target_={target!r} cannot be imported: there is no module {e.name!r} on "
                                 f"this Python's path; {_path_fix(e.name)}") from None
            raise ValueError(_raised(target, f"importing {name}", e, fix="install what it imports, or fix that "
                                     "module: it must import where trainlab and its workers run")) from None
        except Exception as e:  # noqa: BLE001 - the user's module raised while importing
            raise ValueError(_raised(target, f"importing {name}", e, fix="fix that module: it must import where "
                                     "trainlab and its workers run")) from None
    found = module
    for j, attr in enumerate(parts[i:], start=i):
        if not hasattr(found, attr):
            owner = ".".join(parts[:j])
            names = sorted(n for n, v in vars(found).items() if callable(v) and not n.startswith("_")
                           and getattr(v, "__module__", owner) == owner)[:8]
            hint = f"; its functions: {', '.join(names)}" if names else ""
            raise ValueError(f"model._target_={target!r}: {owner} ({getattr(found, '__file__', None) or 'a module'}) "
                             f"has no attribute {attr!r}; name the function that returns your nn.Module{hint}")
        found = getattr(found, attr)
    if not callable(found):
        kind = type(found).__name__
        raise ValueError(f"model._target_={target!r} is {'an' if kind[0] in 'aeiou' else 'a'} {kind}, not a function; "
                         "name the function "
                         "that returns your nn.Module")
    return found


def _path_fix(module: str) -> str:
    """Where to put `module` so that it imports: the working directory holds it, but the `trainlab`
    command does not search it (only `python -m` does)."""
    here = os.path.join(os.getcwd(), *module.split("."))
    if os.path.isfile(here + ".py") or os.path.isdir(here):
        return (f"it is in the working directory, which the trainlab command does not search: run "
                f"PYTHONPATH={os.getcwd()} trainlab train ...")
    return "put the folder holding it on PYTHONPATH where trainlab runs (PYTHONPATH=/that/folder), or fix the name"


def _raised(target: str, doing: str, e: BaseException, *, fix: str) -> str:
    text = str(e).strip().splitlines()
    return f"model._target_={target!r}: {doing} raised {type(e).__name__}{f': {text[0][:200]}' if text else ''}; {fix}"


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
    else on the CPU with torch's global RNG. ValueError naming model._target_ and the fix when it
    cannot be imported, cannot take the fields, raises, or returns no module with blocks."""
    build = locate(cfg._target_)
    kwargs = builder_kwargs(build, cfg, vocab_size=vocab_size)
    model = _call(build, kwargs, target=cfg._target_)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model._target_={cfg._target_!r} returned a {type(model).__name__}, not an nn.Module; "
                         "return your module (tokens [B, T] -> logits [B, T, V])")
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise ValueError(f"model._target_={cfg._target_!r} returned a {type(model).__name__} without blocks in "
                         "`.layers`; keep your blocks in an nn.ModuleList named layers (FSDP, activation "
                         "checkpointing and compile work per block)")
    on_meta = any(p.is_meta for p in model.parameters())
    if on_meta and not shapes_only and not callable(getattr(model, "init_weights", None)):
        with torch.device("cpu"):  # it cannot initialise itself after a meta build: build it for real
            model = _call(build, kwargs, target=cfg._target_)
    return model


def _call(build, kwargs: dict, *, target: str):
    """build(**kwargs), or ValueError in one line: the parameters no model.* field fills, or what
    the builder raised (its type and message; the exception stays chained, with its traceback)."""
    try:
        inspect.signature(build).bind(**kwargs)
    except TypeError:
        params = inspect.signature(build).parameters.values()
        unfilled = [p.name for p in params if p.default is inspect.Parameter.empty and p.name not in kwargs
                    and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
        raise ValueError(f"model._target_={target!r} takes {', '.join(unfilled)}, which no model.* field fills (it is "
                         f"called with the fields its signature names: {', '.join(sorted(kwargs)) or 'none'}); give "
                         f"{'them' if len(unfilled) > 1 else 'it'} a default, or name model fields "
                         "(dim, n_layers, n_heads, vocab_size, ...)") from None
    except ValueError:
        pass  # no signature to read (a builtin): called as it is
    try:
        return build(**kwargs)
    except Exception as e:
        meta = " (trainlab builds it on the meta device first, for its shapes: make tensors there without reading " \
               "their values)" if "meta" in str(e) else ""
        raise ValueError(_raised(target, f"building it with {_shown(kwargs)}", e,
                                 fix=f"fix the builder or the model.* fields it reads{meta}")) from e


def _shown(kwargs: dict) -> str:
    items = [f"{k}={v!r}" for k, v in sorted(kwargs.items())]
    return ", ".join(items) if len(items) <= 6 else f"{len(items)} model.* fields"


def is_custom(cfg: ModelConfig) -> bool:
    return bool(cfg._target_)


__all__ = ["build_custom", "builder_kwargs", "is_custom", "locate"]
