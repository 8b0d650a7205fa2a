"""Activation checkpointing: recompute transformer blocks in backward instead of storing them.

    n = apply_activation_checkpointing(model, mode="block")      # every block
    n = apply_activation_checkpointing(model, mode="selective")  # every other block

A checkpointed block keeps only its inputs for backward (one [B, T, D] hidden state; the
rotary tables are views of buffers) and runs its forward a second time when backward
reaches it: about a third more compute for the blocks' share of the activation memory.
"selective" is torchtitan's per-layer selective option with ac_freq=2: blocks 1, 3, 5, ...
of the full model (odd index, so n_layers // 2 of them) are checkpointed, the others keep
their activations; memory and the extra compute land in between.

Names stay the same. torch's `checkpoint_wrapper` puts the block inside a
`CheckpointWrapper`, so `named_parameters()` / `named_modules()` gain a
``_checkpoint_wrapped_module.`` segment (only `state_dict()` strips it again, by hooks) and
the block is no longer a `TransformerBlock`. The numerics probes, keep_hp globs, telemetry
and checkpoints all go by name and type, so here the block's own `forward` is replaced
instead (an instance attribute that calls the class's forward through
``torch.utils.checkpoint.checkpoint(use_reentrant=False)``): the module tree, its names,
its state_dict keys and its type are untouched, and `copy.deepcopy` (pipeline stages)
rebinds the wrapper to the copy. (Pickling the whole module, ``torch.save(model)``, would
fail on the bound method; checkpoints save state_dicts.)

Composition:
- Forward hooks and forward code of modules inside a block (numerics probes, SwiGLU
  monitor, NaN injection, delayed-FP8 amax recording) run twice: once in forward and again in the recompute.
  That is harmless for each of them: the probe measures a (layer, kind) only the first time
  (the recompute's output never receives a gradient, so its grad hook never fires), the
  SwiGLU monitor and delayed FP8 keep a running max of the same values, NaN injection is a
  function of the step. A new hook that accumulates (a sum, a counter) would count twice.
  Hooks on the block itself run once (they sit outside the checkpointed function).
- FSDP2 (`fully_shard`, applied after): its hooks sit on the block, outside the
  checkpoint; backward unshards the block's parameters before the recompute needs them,
  as with torchtitan's wrapper. FSDP2 (ZeRO-3), DDP and tensor parallel (with and without
  sequence parallel) on 2 gloo ranks give the one-process gradients to 2e-8.
- torch.compile: dynamo traces `torch.utils.checkpoint` as a higher-order op. A whole-model
  compile (train.compile_unit=model) happens before parallelize(), but compilation is lazy,
  so the first traced forward already sees the checkpointed blocks; a per-block compile
  (train.compile_unit=block) wraps the checkpointed block. Both checked with aot_eager and inductor
  on CPU: no graph break, same loss and gradients.
- RNG state is saved and restored around the recompute (torch's default), so a block with
  dropout would recompute the same mask; the model has none today.
"""

from __future__ import annotations

import types

from torch import nn
from torch.utils.checkpoint import checkpoint

MODES = ("none", "block", "selective")
SELECTIVE_EVERY = 2
"""selective: checkpoint every SELECTIVE_EVERY-th block (torchtitan's ac_freq)."""


def apply_activation_checkpointing(model: nn.Module, mode: str) -> int:
    """Checkpoint the transformer blocks of `model` in place; returns how many are checkpointed.

    model: a `Transformer` or one of its pipeline stages (blocks found through
    ``model.blocks()``, else ``model.layers``), possibly wrapped by torch.compile. Call it
    after tensor parallel and before FSDP2 / DDP. Applying it twice leaves a block
    checkpointed once. mode: none, block (every block) or selective (blocks with an odd
    index in the full model: n_layers // 2 of them; a pipeline stage keeps the full model's
    choice, its blocks being keyed by that index).
    """
    if mode not in MODES:
        raise ValueError(f"activation checkpointing mode {mode!r} is not one of {', '.join(MODES)}; "
                         f"set parallel.activation_checkpoint to one of them")
    if mode == "none":
        return 0
    count = 0
    for index, block in indexed_blocks(model):
        if mode == "selective" and index % SELECTIVE_EVERY != SELECTIVE_EVERY - 1:
            continue
        if not is_checkpointed(block):
            block.forward = types.MethodType(_checkpointed_forward, block)
        count += 1
    return count


def is_checkpointed(module: nn.Module) -> bool:
    """True if `module`'s forward was wrapped by `apply_activation_checkpointing`."""
    forward = module.__dict__.get("forward")
    return getattr(forward, "__func__", None) is _checkpointed_forward


def _checkpointed_forward(self: nn.Module, *args, **kwargs):
    # The class's forward, skipping this instance attribute. Only the block's inputs are kept
    # for backward; its forward runs again (with its submodules' hooks) when backward needs it.
    return checkpoint(type(self).forward, self, *args, use_reentrant=False, **kwargs)


def indexed_blocks(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(index in the full model, block): a pipeline stage's ModuleDict is keyed by it."""
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    layers = getattr(model, "layers", None)
    if isinstance(layers, nn.ModuleDict):
        return [(int(key) if key.isdigit() else position, block)
                for position, (key, block) in enumerate(layers.items())]
    if hasattr(model, "blocks"):
        return list(enumerate(model.blocks()))
    if isinstance(layers, nn.ModuleList):
        return list(enumerate(layers))
    raise ValueError(f"activation checkpointing needs a model with transformer blocks in "
                     f"`.layers` (ModuleList or ModuleDict) or `.blocks()`; "
                     f"{type(model).__name__} has neither")


__all__ = ["MODES", "apply_activation_checkpointing", "indexed_blocks", "is_checkpointed"]
