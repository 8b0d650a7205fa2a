"""Sampled numerics of every pipeline stage, on every rank of the pipeline (rank 0 logs them).

Under parallel.pp a rank runs only its stages, so its probes see only their layers. The
per-layer metrics keep the model's names (parallel.parts), so the stages' sets are disjoint
and are united; a maximum over layers is taken over every stage; a ratio pooled over layers
(fp16's gradient underflow, the update-to-weight ratio) is summed over the stages before it
is divided (`sum_over_stages`); what every rank computes alike (the gradient-norm
percentiles of the global norm) is taken as is. Collectives over the pipeline group, on
sampled steps only: they pickle a few hundred floats.

    numerics = gather_over_stages(local_numerics, group=pipeline.group)
"""

from __future__ import annotations

import torch.distributed as dist

from trainlab import names

MAXIMA = frozenset({
    *(names.cast_max_metric(tensor, stat) for tensor in names.CAST_TENSORS for stat in names.CAST_STATS),
    names.NUM_SWIGLU_AMAX, names.NUM_SWIGLU_OUTLIER, names.NUM_SWIGLU_ALIGNMENT,
    names.UPDATE_TO_WEIGHT_MAX,
})
"""Metrics that are a maximum over the layers (or blocks, or parameter tensors) of the model."""
MINIMA = frozenset(names.cast_min_metric(tensor, names.CAST_SCALE) for tensor in names.CAST_TENSORS)
"""Metrics that are a minimum over the layers of the model."""


def _all_gather(value, group) -> list:
    """`value` of every rank of `group`, in group-rank order ([value] without a group)."""
    if group is None or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return [value]
    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, value, group=group)
    return out


def sum_over_stages(values: list[float], *, group) -> list[float]:
    """Element-wise sum of `values` over the ranks of `group` (a collective; `values` as is
    with group None): the parts of a pooled ratio, before it is divided."""
    return [sum(column) for column in zip(*_all_gather(list(values), group))]


def gather_over_stages(metrics: dict[str, float], *, group) -> dict[str, float]:
    """The sampled numerics of every rank of the pipeline group `group`, merged as the module
    docstring says (a collective; `metrics` as is with group None)."""
    merged: dict[str, float] = {}
    for rank_metrics in _all_gather(metrics, group):
        for key, value in rank_metrics.items():
            if key in merged and key in MAXIMA:
                merged[key] = max(merged[key], value)
            elif key in merged and key in MINIMA:
                merged[key] = min(merged[key], value)
            else:
                merged.setdefault(key, value)
    return merged


__all__ = ["MAXIMA", "MINIMA", "gather_over_stages", "sum_over_stages"]
