"""Update-to-weight ratio ||w_after - w_before|| / ||w_before|| of one optimizer step.

    meter = UpdateMeter(optimizer, params)
    with meter.measuring():
        applied = recipe.step(optimizer, grads_finite=...)   # optimizer.step() runs in chunks
    metrics = meter.result() if applied else {}               # a collective (FSDP2, TP, ZeRO-1)

The ratio is of what the step really did to the weights (rounding included: a bf16 weight
whose update rounds away reads 0, which is what the metric is for), so it needs each weight
before the step. Copying every parameter first would hold a second copy of the model on
sampled steps (a DDP replica's full size). Instead the step runs in chunks of parameters:
each chunk is copied, stepped (the others' gradients hidden, so the optimizer skips them) and
measured, and its copy freed before the next. Peak extra memory: one chunk, at most an
eighth of the parameters' bytes or the largest parameter. AdamW-style optimizers update each
parameter from its own gradient and state alone, in parameter order, so the chunked step
gives the same weights and state, bit for bit (tests/unit/test_update_ratio.py).

DTensor parameters (FSDP2, tensor parallel) are measured on their local shards, the norms
reduced over their mesh (DTensor does it); a ZeroRedundancyOptimizer steps only this rank's
partition, so the sums of squares are all-reduced over its group; a pipeline rank measures
its own stages.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist

from trainlab import names
from trainlab.telemetry.sharded import full
from trainlab.telemetry.stages import sum_over_stages

CHUNK_FRACTION = 8
"""A chunk holds at most 1/CHUNK_FRACTION of the parameters' bytes (or the largest one)."""


def _sq_norm(t: torch.Tensor) -> float:
    """||t||^2 of the whole tensor (a DTensor's norm is reduced over its mesh: a collective)."""
    return float(full(torch.linalg.vector_norm(t.detach().float()))) ** 2


def _ratios(sq: Sequence[tuple[float, float]], *, stages=None) -> dict[str, float]:
    """(||delta||^2, ||w||^2) per tensor -> the ratio over all of them and the largest one.
    `stages`: the pipeline group (a collective): the total pools every stage's tensors (the
    largest is merged over stages by telemetry.stages.gather_over_stages)."""
    if not sq and stages is None:
        return {}
    delta_sq, weight_sq = sum_over_stages([sum(d for d, _ in sq), sum(w for _, w in sq)], group=stages)
    total = math.sqrt(delta_sq) / max(math.sqrt(weight_sq), 1e-12)
    largest = max((math.sqrt(d) / max(math.sqrt(w), 1e-12) for d, w in sq), default=0.0)
    return {names.UPDATE_TO_WEIGHT: total, names.UPDATE_TO_WEIGHT_MAX: largest}


def update_to_weight(params: list[torch.Tensor], before: list[torch.Tensor]) -> dict[str, float]:
    """||w_after - w_before|| / ||w_before||: over all parameters, and the largest per tensor.

    Around 1e-3 is healthy for Adam-style training; a layer far above it is being rewritten
    each step (too high an LR for it, or a precision artefact)."""
    return _ratios([(_sq_norm(a.detach() - b), _sq_norm(b)) for a, b in zip(params, before)])


class UpdateMeter:
    """`update_to_weight` of one optimizer step without a copy of every parameter."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        self.params = list(params)
        """Every parameter the ratio covers, in the same order on every rank."""
        zero = isinstance(optimizer, ZeroRedundancyOptimizer)
        self._optimizer = optimizer.optim if zero else optimizer  # the one that steps this rank's share
        self._group = optimizer.process_group if zero else None
        self._sq: dict[int, tuple[float, float]] = {}
        sizes = [p.numel() * p.element_size() for p in self.params]  # global sizes: equal on every rank
        self._budget = max([*sizes, sum(sizes) // CHUNK_FRACTION]) if sizes else 0

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        """While open, the optimizer's step() runs chunk by chunk and records the ratios."""
        opt = self._optimizer
        own = vars(opt).get("step")  # an LR scheduler wraps step on the instance
        inner_step = opt.step

        def chunked_step(*args, **kwargs):
            return self._chunked(inner_step, *args, **kwargs)

        opt.step = chunked_step
        try:
            yield
        finally:
            if own is None:
                del opt.step
            else:
                opt.step = own

    def _chunked(self, step, *args, **kwargs):
        assert not args and "closure" not in kwargs, "a closure would run once per chunk"
        stepped = [p for g in self._optimizer.param_groups for p in g["params"] if p.grad is not None]
        grads = [p.grad for p in stepped]
        out = None
        try:
            for chunk in self._chunks(stepped):
                ids = {id(p) for p in chunk}
                for p, g in zip(stepped, grads):
                    p.grad = g if id(p) in ids else None
                before = [p.detach().clone() for p in chunk]
                out = step(**kwargs)
                for p, b in zip(chunk, before):
                    self._sq[id(p)] = (_sq_norm(p.detach() - b), _sq_norm(b))
                del before
        finally:
            for p, g in zip(stepped, grads):
                p.grad = g
        return out

    def _chunks(self, params: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
        chunk: list[torch.Tensor] = []
        size = 0
        for p in params:
            nbytes = p.numel() * p.element_size()
            if chunk and size + nbytes > self._budget:
                yield chunk
                chunk, size = [], 0
            chunk.append(p)
            size += nbytes
        if chunk:
            yield chunk

    def result(self, *, stages=None) -> dict[str, float]:
        """The ratios of the measured step over `params` (a collective where the parameters
        or the optimizer are sharded, or over the pipeline group `stages`: every rank calls it). A parameter this rank's optimizer
        holds but did not step (no gradient) counts with a zero update."""
        mine = {id(p) for g in self._optimizer.param_groups for p in g["params"]}
        sq = [self._sq.get(id(p)) or ((0.0, _sq_norm(p)) if id(p) in mine else (0.0, 0.0))
              for p in self.params]
        if self._group is not None and dist.get_world_size(self._group) > 1:
            # each parameter is stepped (and so measured) by the one rank that owns it
            device = self.params[0].device if self.params else torch.device("cpu")
            flat = torch.tensor(sq, dtype=torch.float64, device=device)
            dist.all_reduce(flat, group=self._group)
            sq = [tuple(row) for row in flat.tolist()]
        return _ratios(sq, stages=stages)


__all__ = ["CHUNK_FRACTION", "UpdateMeter", "update_to_weight"]
