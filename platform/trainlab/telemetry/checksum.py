"""Checksums of a trial's outcome that are comparable across layouts and device sets.

Two runs of the same math on different device sets can still differ: reduction order,
kernels and collectives round differently. To tell "identical" from "close" (and from "not
the same"), every trial ends with

- a SHA-256 over the FULL final parameters in a layout-independent canonical form: sorted by
  the original model's parameter name, each the float32 bytes of the unsharded tensor. DDP,
  FSDP2, tensor- and pipeline-parallel runs of the same math hash the same bytes;
- a SHA-256 of the per-step train losses as float64 bytes (exact, no formatting);
- the final parameter L2 norm, a float that says "by how much" when the hashes differ.

Canonical names: wrappers add path segments that the model's own names do not have (DDP's
``module.``, torch.compile's ``_orig_mod.``, activation checkpointing's
``_checkpoint_wrapped_module.``); they are dropped. Pipeline stages are pruned copies of the
model that keep its names (``layers.<i>.…``), so their pieces are merged across ranks.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from trainlab.distributed import gather_strings
from trainlab.telemetry.sharded import full

WRAPPER_SEGMENTS = ("module", "_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")
"""Path segments that wrappers insert into parameter names; never part of the model's own."""


@dataclass(frozen=True)
class ParamChecksum:
    sha256: str
    """SHA-256 over the sorted 'name shape sha256(float32 bytes)' lines of every parameter."""
    norm: float
    """L2 norm of all parameters (float64 sum of float32 squares)."""
    num_tensors: int


def canonical_name(name: str) -> str:
    """`name` without the segments wrappers insert: 'module._orig_mod.layers.0.w' -> 'layers.0.w'."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_SEGMENTS)


def _whole(p: torch.Tensor) -> torch.Tensor:
    """The unsharded value of a parameter: DTensors are gathered (a collective); a tensor-parallel
    parameter that DDP holds as its local shard (torch's tp+ddp transform) is rebuilt first."""
    info = getattr(p, "_st_info", None)  # an attribute of the parameter: detach() drops it
    t = p.detach()
    if info is not None:
        from torch.distributed.tensor.parallel._data_parallel_utils import _unflatten_tensor

        t = _unflatten_tensor(t, info)
    return full(t)


@torch.no_grad()
def param_digests(modules: Iterable[nn.Module]) -> dict[str, tuple[str, float]]:
    """canonical name -> ('shape:sha256 of float32 bytes', sum of squares) for this rank's
    parameters. Every rank must call it together: sharded parameters are gathered."""
    out: dict[str, tuple[str, float]] = {}
    for module in modules:
        for name, p in module.named_parameters():
            t = _whole(p).to(torch.float32).cpu().contiguous()
            digest = hashlib.sha256(t.numpy().tobytes()).hexdigest()
            shape = "x".join(map(str, t.shape))
            out[canonical_name(name)] = (f"{shape}:{digest}", float(t.double().square().sum()))
    return out


def combine(digests: dict[str, tuple[str, float]]) -> ParamChecksum:
    """One checksum and norm from per-parameter digests, in sorted-name order."""
    h = hashlib.sha256()
    for name in sorted(digests):
        h.update(f"{name} {digests[name][0]}\n".encode())
    norm = math.sqrt(sum(sq for _, sq in digests.values()))
    return ParamChecksum(sha256=h.hexdigest(), norm=norm, num_tensors=len(digests))


def params_checksum(modules: Iterable[nn.Module], *, partial: bool = False) -> ParamChecksum:
    """The checksum of the whole model, the same on every rank.

    partial: each rank holds only some of the parameters (pipeline stages): the per-parameter
    digests of all ranks are merged by name (data-parallel replicas of a stage agree; the
    lowest rank's is kept)."""
    digests = param_digests(modules)
    if partial:
        merged: dict[str, tuple[str, float]] = {}
        for text in gather_strings(json.dumps(digests)):
            for name, (digest, sq) in json.loads(text).items():
                merged.setdefault(name, (digest, sq))
        digests = merged
    return combine(digests)


def loss_curve_sha256(losses: Sequence[float]) -> str:
    """SHA-256 of the per-step losses as little-endian float64: equal only if every bit is."""
    return hashlib.sha256(struct.pack(f"<{len(losses)}d", *losses)).hexdigest()


__all__ = ["ParamChecksum", "WRAPPER_SEGMENTS", "canonical_name", "combine", "loss_curve_sha256",
           "param_digests", "params_checksum"]
