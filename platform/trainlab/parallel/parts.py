"""The modules a rank trains, under the single-process model's names, whatever the layout.

Whatever holds state about particular layers (the precision recipe's casts and delayed
scales, the numerics probe, NaN injection) must refer to the modules that run, not to the
model they were made from: a pipeline stage is a pruned deep copy of the model
(parallel.pp.split_stages), and DDP / torch.compile wrap it with prefixes in its names.

    parts = model_parts(model)        # [the model], or this rank's pipeline stages
    modules = modules_by_name(model)  # "layers.2.attention.wq" -> the module that trains it

Every layout keeps the model's names inside a part: tensor parallel, FSDP2, activation
checkpointing and per-block compile work in place; a stage keeps its blocks under
``layers.<index in the full model>``. A pipeline rank holds only some layers, so a name
the model has may be missing here (another rank holds it).
"""

from __future__ import annotations

from torch import nn

from trainlab.parallel import unwrap


def model_parts(model: nn.Module) -> list[nn.Module]:
    """The pieces of the model that `model` (what parallelize or the pipeline split gave the
    trainer) runs on this rank, each unwrapped so that its names are the model's own: this
    rank's pipeline stages when `model` is their `nn.ModuleList` (in stage order), else the
    model itself."""
    if holds_stages(model):
        return [unwrap(stage) for stage in unwrap(model)]
    return [unwrap(model)]


def holds_stages(model: nn.Module) -> bool:
    """True when `model` is a pipeline rank's stages (an `nn.ModuleList` of them; the model
    itself is never a list): names the model has may then live on another rank."""
    return isinstance(unwrap(model), nn.ModuleList)


def modules_by_name(model: nn.Module) -> dict[str, nn.Module]:
    """Name in the single-process model -> the module that runs under it on this rank."""
    found: dict[str, nn.Module] = {}
    for part in model_parts(model):
        for name, module in part.named_modules():
            if name:  # each stage's root and containers repeat; the layers under them do not
                found.setdefault(name, module)
    return found


__all__ = ["holds_stages", "model_parts", "modules_by_name"]
