"""Initial weights that do not depend on the layout: build on meta, shard, then initialise.

    with torch.device("meta"):
        model = build_model(cfg, vocab_size=v)     # shapes only, no memory
    model = parallelize(model, ...)                # TP / FSDP2 shard it, a pipeline cuts it
    materialize(model, device=device, seed=seed)   # this rank's storage, then its values

Every parameter is drawn from its own generator, seeded by (seed, parameter name), for the
full tensor, on the host; a rank keeps the part its layout gives it (a DTensor's local shard,
a pipeline stage's blocks, a whole replica). So one process, DDP, FSDP2, tensor parallel and
pipeline stages start from the same numbers, bit for bit, and a rank's memory never holds
the unsharded model: only its own part plus one full parameter at a time (the largest, the
embedding or head, is vocab x dim).

Why not torchtitan's way: it calls ``model.init_weights()`` on the sharded model, so
``nn.init.normal_`` runs on each DTensor and draws the shard's values from the device RNG
(DTensor's offset-based RNG tracker keeps shards of one tensor distinct, on CUDA). That is
cheaper (no full tensor per rank) but the values depend on the layout, the device and the
order of the draws: an FSDP2 run and a one-process run start from different weights, and our
layout tests compare their loss curves to 1e-5; the host generator also makes a GPU run
start from the CPU run's weights. The cost: each rank draws every parameter it holds a part
of in full, on one CPU core (torch's CPU generator), once per trial before the first step:
38 M normals/s measured on a busy core here, so about 3 minutes for 7b's 7e9 and ~1 s for
small models. (Seeding blocks of rows separately would let an FSDP rank draw only its rows.)

Buffers have no seed: each module that owns one defines ``init_buffers()`` (the rotary
tables, fp8 delayed-scaling histories), called after the parameters.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

import torch
from torch import nn

Fill = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
"""(empty full-size float32 host tensor, its generator) -> the tensor filled in place."""


def param_seed(seed: int, name: str) -> int:
    """The generator seed of parameter `name` (its name in the unwrapped model): stable across
    processes and Python runs (not Python's salted ``hash``)."""
    digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def normal(std: float) -> Fill:
    return lambda t, g: t.normal_(0.0, std, generator=g)


def ones() -> Fill:
    return lambda t, _g: t.fill_(1.0)


@torch.no_grad()
def fill_parameter(param: torch.Tensor, fill: Fill, *, seed: int, name: str) -> None:
    """Write the full tensor `fill` makes (float32, on the host, from `name`'s generator) into
    `param`: all of it into a plain tensor, this rank's shard into a DTensor."""
    spec = _dtensor_spec(param)
    full = fill(torch.empty(param.shape if spec is None else spec[2], dtype=torch.float32),
                torch.Generator().manual_seed(param_seed(seed, name)))
    local = _local(param)
    if spec is not None:
        from torch.distributed.tensor import distribute_tensor

        # src_data_rank=None: every rank made the same full tensor, so each slices its own
        # shard locally (the default would scatter rank 0's, a collective per parameter)
        full = distribute_tensor(full, spec[0], spec[1], src_data_rank=None).to_local()
    assert full.shape == local.shape, f"{name}: shard {tuple(full.shape)} != parameter {tuple(local.shape)}"
    local.copy_(full)  # casts to the parameter's dtype (bf16_pure) and device


def _dtensor_spec(t: torch.Tensor):
    """(mesh, placements, global shape) of a DTensor, or of a local tensor torch's DDP-over-TP
    transform made from one (`_pre_dp_module_transform` keeps its DTensorSpec in `_st_info`);
    None for a plain tensor."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return t.device_mesh, t.placements, t.shape
    info = getattr(t, "_st_info", None)
    return None if info is None else (info.mesh, info.placements, info.shape)


def global_shape(t: torch.Tensor) -> torch.Size:
    """The full shape of a parameter, whatever shard of it this rank holds."""
    spec = _dtensor_spec(t)
    return t.shape if spec is None else spec[2]


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _is_meta(module: nn.Module) -> bool:
    return any(_local(t).is_meta for t in (*module.parameters(), *module.buffers()))


def model_roots(model: nn.Module | Iterable[nn.Module]) -> list[nn.Module]:
    """The models under wrappers (DDP's `module`, torch.compile's `_orig_mod`): parameter
    names must be the bare model's, whatever wraps it. A list (or nn.ModuleList) of
    pipeline stages gives each stage."""
    if isinstance(model, nn.ModuleList) or not isinstance(model, nn.Module):
        return [r for m in model for r in model_roots(m)]
    while True:
        # not `a or b`: bool() of torch.compile's wrapper calls len() of the model, which raises
        inner = getattr(model, "module", None)
        if inner is None:
            inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return [model]
        model = inner


def materialize(model: nn.Module | Iterable[nn.Module], *, device: torch.device | str, seed: int) -> None:
    """Give a model built on the meta device (and since sharded, split or wrapped) storage on
    `device`, then its initial values: `init_weights(seed=seed)` of each root model (a pipeline
    rank's stages: each stage) and `init_buffers()` of every module that owns buffers.

    A model that already has storage (DDP allocates it, see parallel.ddp) is initialised in
    place. The values do not depend on the layout (module docstring)."""
    for root in model_roots(model):
        if _is_meta(root):
            root.to_empty(device=device)
        elif not hasattr(root, "init_weights"):
            continue  # model=custom built for real from the run's seed (models.custom): already initialised
        init_weights = getattr(root, "init_weights", None)
        assert callable(init_weights), f"{type(root).__name__} has no init_weights(seed=...)"
        init_weights(seed=seed)
        if getattr(root, "initializes_buffers", False):
            continue  # its init_weights set the buffers too (models.hf_any)
        for module in root.modules():
            if next(module.buffers(recurse=False), None) is None:
                continue
            init_buffers = getattr(module, "init_buffers", None)
            # an invariant: after to_empty a buffer holds whatever memory it was given
            assert callable(init_buffers), (
                f"{type(module).__name__} owns buffers but has no init_buffers(): they would "
                f"stay uninitialised after a meta-device build")
            init_buffers()


__all__ = ["fill_parameter", "global_shape", "materialize", "model_roots", "normal", "ones", "param_seed"]
