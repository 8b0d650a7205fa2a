"""A trial's estimate as it is recorded: the est/... metrics and tags, and measured/estimated ratios.

    tracker.log_metrics(estimate_metrics(plan.estimate), step=start)   # beside sys/peak_mem_gb
    tracker.set_tags(estimate_tags(plan.estimate))
    tracker.log_metrics(ratio_metrics(plan.estimate, peak_mem_gb=..., tokens_per_s=...), step=last)

Every function takes None (nothing estimated the trial) and then returns nothing to log, so the
engine never branches on whether the driver estimated. The names are names.EST_*; compare and
`trainlab calibrate` read them back.
"""

from __future__ import annotations

import math

from trainlab import names
from trainlab.estimate.result import GB, Estimate


def estimate_metrics(est: Estimate | None) -> dict[str, float]:
    """The estimate as metrics, each the counterpart of a measured one: rank 0's peak (as
    sys/peak_mem_gb), the largest rank's state by kind (as sys/param_gb ...), the slowest rank's
    step by kind (the step is the slowest rank's)."""
    if est is None:
        return {}
    mems = [r.memory for r in est.ranks]
    t = est.slowest.time
    out = {
        names.EST_PEAK_MEM_GB: est.ranks[0].memory.total_gb,
        names.EST_PEAK_MEM_GB_MAX: est.peak_mem_gb,
        names.EST_STEP_TIME_S: est.step_time_s,
        names.EST_TOKENS_PER_S: est.tokens_per_s,
        names.EST_PARAM_GB: max(m.params for m in mems) / GB,
        names.EST_GRAD_GB: max(m.grads for m in mems) / GB,
        names.EST_OPTIM_STATE_GB: max(m.optim_state for m in mems) / GB,
        names.EST_ACTIVATION_GB: max(m.activations for m in mems) / GB,
        names.EST_COMPUTE_S: t.compute_s,
        names.EST_COMM_S: t.comm_s,
        names.EST_BUBBLE_S: t.bubble_s + t.wait_s,  # idle either way: the schedule's or a faster rank's
    }
    if est.mfu is not None:
        out[names.EST_MFU] = est.mfu
    return out


def cluster_of(est: Estimate) -> str:
    """The devices the estimate placed the ranks on, node by node: '2xcpu', '8xH100 + 8xH100'."""
    nodes: dict[int, tuple[str, int]] = {}
    for r in est.ranks:
        name, n = nodes.get(r.device.node, (r.device.name, 0))
        nodes[r.device.node] = (name, n + 1)
    return " + ".join(f"{n}x{name}" for _, (name, n) in sorted(nodes.items()))


def estimate_tags(est: Estimate | None) -> dict[str, str]:
    if est is None:
        return {}
    return {names.TAG_EST_BOUND: est.bound, names.TAG_EST_CALIBRATION: est.calibration,
            names.TAG_EST_CLUSTER: cluster_of(est)}


def _ratio(measured: float | None, estimated: float) -> float | None:
    ok = measured is not None and math.isfinite(measured) and measured > 0
    return measured / estimated if ok and estimated > 0 and math.isfinite(estimated) else None


def ratio_metrics(est: Estimate | None, *, peak_mem_gb: float | None, tokens_per_s: float | None
                  ) -> dict[str, float]:
    """measured / estimated at the trial's end, where both are numbers (a trial that failed at
    its first step measured no tokens/s). The step time measured is tokens per step over the
    trial's median tokens/s, so the two time ratios are each other's inverse."""
    if est is None:
        return {}
    ratios = {
        names.EST_PEAK_MEM_RATIO: _ratio(peak_mem_gb, est.ranks[0].memory.total_gb),
        names.EST_TOKENS_PER_S_RATIO: _ratio(tokens_per_s, est.tokens_per_s),
        names.EST_STEP_TIME_RATIO: _ratio(est.tokens_per_step / tokens_per_s, est.step_time_s)
        if tokens_per_s and math.isfinite(tokens_per_s) and tokens_per_s > 0 else None,
    }
    return {k: v for k, v in ratios.items() if v is not None}
