"""torch.compile per transformer block (train.compile_unit=block), torchtitan's way.

    n = compile_blocks(model)   # after tensor parallel and checkpointing, before FSDP2
    model = compile_model(model)   # train.compile_unit=model: ddp / zero1 / one process only

Each block gets `nn.Module.compile()`, which compiles the module's call in place: the
module tree, its parameter names, its type and its hooks stay as they are, so FSDP2's
per-block `fully_shard`, the numerics probes, keep_hp globs and checkpoints see the same
model as in eager mode. The blocks share one code object and dynamo reuses the block's
graph across them (4 blocks, fp32 on CPU: 2 graphs in all). On sampled steps the numerics
probes' hooks run eagerly, a graph break there, as with a whole-model compile.

A whole-model graph cannot be sharded or split afterwards, which is why tensor parallel,
pipelines and FSDP2 layouts need this unit (`config.validate.check_parallel` says so).
Pipeline stages are compiled after the split: `copy.deepcopy` would copy a compiled call
that still points at the original block.
"""

from __future__ import annotations

import torch
from torch import nn

from trainlab.parallel.activation_checkpoint import indexed_blocks


def compile_blocks(model: nn.Module) -> int:
    """Compile every transformer block of `model` (a Transformer or a pipeline stage) in
    place; returns how many. The numerics probes arm hooks on sampled steps only, so dynamo
    is told to guard on hooks (a hook change recompiles instead of being ignored)."""
    torch._dynamo.config.skip_nnmodule_hook_guards = False
    blocks = indexed_blocks(model)
    for _, block in blocks:
        block.compile()
    return len(blocks)


def compile_model(model: nn.Module) -> nn.Module:
    """The whole model as one graph (train.compile_unit=model): only for layouts that neither
    shard nor split it afterwards (config.validate.check_parallel). Returns the compiled
    wrapper (`parallel.unwrap` finds the model inside); hooks are guarded as above."""
    torch._dynamo.config.skip_nnmodule_hook_guards = False
    return torch.compile(model)


__all__ = ["compile_blocks", "compile_model"]
