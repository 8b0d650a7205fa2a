"""The values a trial returns to its sweeper (hydra.launcher.objective; vocab.objectives says what
each one is and which way is better), from what the driver saw of it: its result and the val-loss
curve its events carried; for a trial skipped as done before, from its earlier run's metrics.

A diverged trial returns each objective's worst value (inf, or -inf where higher is better): its
model is unusable, so a sweeper must never prefer it, and Optuna refuses NaN. A pruned trial
returns what it reached (its last val loss, as Optuna records for a pruned trial)."""

from __future__ import annotations

import math

from trainlab import names
from trainlab.config.study_rule import StudyConfig
from trainlab.launch.pruner import value_at
from trainlab.launch.sweep_trial import Trial
from trainlab.vocab.objectives import Objective

_FROM_METRICS = {"val_loss": names.VAL_LOSS, "tokens_per_s": names.TOKENS_PER_S, "peak_mem_gb": names.PEAK_MEM_GB}
"""The metric an objective falls back to on an earlier run that logged no objective/<name>."""


def worst(o: Objective) -> float:
    return math.inf if o.better < 0 else -math.inf


def tokens_to(curve: list[tuple[int, float]], target: float) -> float | None:
    """Tokens at which the curve first reaches `target`, interpolated between validations."""
    for i, (tokens, loss) in enumerate(curve):
        if loss <= target:
            if i == 0:
                return float(tokens)
            t0, l0 = curve[i - 1]
            return t0 + (tokens - t0) * (l0 - target) / (l0 - loss)
    return None


def trial_values(t: Trial, study: StudyConfig) -> dict[str, float] | None:
    """{objective name: value} of a trial that ran; None when it has no result (failed)."""
    r = t.result
    if r is None:
        return None
    out = {}
    for o in study.objectives:
        if t.status == names.STATUS_DIVERGED:
            out[o.name] = worst(o)
        elif o.name == "val_loss":
            at = value_at(t.curve, study.objective_tokens) if study.objective_tokens else None
            out[o.name] = r.final_val_loss if at is None else at
        elif o.name == "tokens_per_s":
            out[o.name] = r.tokens_per_s
        elif o.name == "peak_mem_gb":
            out[o.name] = r.peak_mem_gb
        else:  # time_to_loss
            reached = tokens_to(t.curve, study.target_loss)
            out[o.name] = reached / r.tokens_per_s if reached is not None and r.tokens_per_s else math.inf
        if out[o.name] is None or math.isnan(out[o.name]):
            out[o.name] = worst(o)
    return out


def prior_values(metrics: dict[str, float], study: StudyConfig) -> dict[str, float]:
    """The objective values of a trial done in an earlier run of the study (its run's metrics)."""
    out = {}
    for o in study.objectives:
        v = metrics.get(o.metric)
        if v is None and o.name in _FROM_METRICS:
            v = metrics.get(_FROM_METRICS[o.name])
        out[o.name] = worst(o) if v is None or math.isnan(v) else v
    return out


def returned(values: tuple[float, ...] | None):
    """What Hydra's sweeper gets of a trial's values (in the objectives' order): one float, or a list;
    None without values."""
    if values is None:
        return None
    return values[0] if len(values) == 1 else list(values)
