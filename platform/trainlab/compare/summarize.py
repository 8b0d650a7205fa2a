"""The summary table: one row per configuration, seeds aggregated; a pure function of trials.

Definitions (also printed in summary.md and report.html):

- tokens/s: per trial, the median of names.TOKENS_PER_S over its logged steps after the
  first (warm-up); per configuration, mean and sample std of those medians. MFU likewise.
- speedup: configuration's mean tokens/s / the baseline's mean tokens/s.
- final val loss: per trial, the last names.VAL_LOSS; mean and sample std over trials.
- Δ val loss at equal tokens: configuration's mean final val loss minus the baseline's
  val-loss-vs-tokens curve at the configuration's mean final tokens seen. The baseline curve
  at x is the mean over its trials of each trial's names.by_tokens(names.VAL_LOSS) linearly
  interpolated at x; no extrapolation (None when x is outside what every baseline trial covers).
  Negative = lower (better) loss than the baseline had after the same number of tokens.
- tokens to target: per trial, the first tokens-seen at which names.by_tokens(names.VAL_LOSS)
  is <= the target loss (first evaluation that reached it, not interpolated); the row shows
  the mean over the trials that reached it and how many did.
- stability: final cumulative skipped / non-finite / loss-spike counters summed over every
  trial; divergence steps (names.TAG_DIVERGED_STEP) of diverged trials and the steps pruned
  trials stopped at (names.TAG_PRUNED_STEP); max finite grad norm;
  the largest sampled underflow and overflow fraction of any low-precision cast.
- reproducibility: runs that should match (same config up to layout and device set) and
  whether they do; see compare.repro.
- verdict: baseline; failed (every trial failed); diverged (any trial diverged); pruned (every
  trial was stopped early by hydra.launcher.prune); degraded (Δ val loss at equal tokens above
  `tolerance` x the baseline's final val loss); ok.
- Pareto front (a study of several objectives, compare.pareto): per configuration, the mean over
  its finished and pruned trials of each `objective/<name>` its sweeper got; the configurations
  no other one beats on every objective.

Numbers come from finished trials only (a pruned trial stopped before its end: its last val loss
is at fewer tokens); stability columns from every trial.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from trainlab import names
from trainlab.compare import curves, pareto
from trainlab.compare.answer import answer
from trainlab.compare.records import ConfigRow, Summary, Trial
from trainlab.compare.repro import reproducibility
from trainlab.vocab.objectives import Objective
from trainlab.vocab.precision import SPECS

TARGET_FACTOR = 1.05  # default target loss: the baseline's mean final val loss x this
TOLERANCE = 0.01  # default: worse than the baseline by more than 1 % of its val loss = degraded


def precision_rank(precision: str) -> int:
    """The mode's rank in vocab.precision (most precise first); unknown modes sort last."""
    return SPECS[precision].rank if precision in SPECS else len(SPECS)


def default_baseline(rows: Sequence[ConfigRow]) -> str | None:
    """The most precise configuration that finished at least once (ties: label order)."""
    candidates = [r for r in rows if r.has_numbers]
    if not candidates:
        return None
    return min(candidates, key=lambda r: (precision_rank(r.precision), r.label)).label


def final_tokens(trial: Trial) -> float | None:
    """Tokens seen at the trial's last validation (the by-tokens twin's step)."""
    step = curves.last_step(trial.series(names.by_tokens(names.VAL_LOSS)))
    if step is None:  # no by-tokens twin: fall back to the tokens counter at the end
        return curves.last_value(trial.series(names.TOKENS_SEEN))
    return float(step)


def tokens_to_target(trial: Trial, target: float) -> int | None:
    """First tokens-seen where the by-tokens val loss is <= target; None if it never was."""
    for tokens, loss in trial.series(names.by_tokens(names.VAL_LOSS)):
        if math.isfinite(loss) and loss <= target:
            return tokens
    return None


def _final_counter(trials: Sequence[Trial], key: str) -> int | None:
    """Sum over trials of a cumulative counter's last value; None if no trial logged it."""
    finals = [curves.last_value(t.series(key)) for t in trials]
    finals = [f for f in finals if f is not None]
    return int(sum(finals)) if finals else None


def _values(trials: Sequence[Trial], fn) -> list[float]:
    out = [fn(t) for t in trials]
    return [v for v in out if v is not None]


def _base_row(label: str, trials: Sequence[Trial]) -> ConfigRow:
    """Everything about one configuration that does not depend on the baseline."""
    done = [t for t in trials if t.status == names.STATUS_FINISHED]
    count = {s: sum(t.status == s for t in trials) for s in (
        names.STATUS_FINISHED, names.STATUS_DIVERGED, names.STATUS_FAILED, names.STATUS_PRUNED)}
    tps = curves.mean_std(_values(done, lambda t: curves.median_after_first(t.series(names.TOKENS_PER_S))))
    per_device = curves.mean_std(_values([t for t in done if t.world_size], lambda t: _div(
        curves.median_after_first(t.series(names.TOKENS_PER_S)), t.world_size)))
    mfu = curves.mean_std(_values(done, lambda t: curves.median_after_first(t.series(names.MFU))))
    peaks = _values(done, lambda t: curves.max_finite(t.series(names.PEAK_MEM_GB)))
    val = curves.mean_std(_values(done, lambda t: curves.last_value(t.series(names.VAL_LOSS))))
    tokens = curves.mean_std(_values(done, final_tokens))[0]
    grads = _values(trials, lambda t: curves.max_finite(t.series(names.GRAD_NORM)))
    under = _values(trials, lambda t: _max_over(t, names.CAST_UNDERFLOW))
    over = _values(trials, lambda t: _max_over(t, names.CAST_OVERFLOW))
    return ConfigRow(
        label=label,
        precision=next((t.precision for t in trials if t.precision), ""),
        is_baseline=False,
        n_trials=len(trials),
        n_finished=count[names.STATUS_FINISHED],
        n_diverged=count[names.STATUS_DIVERGED],
        n_failed=count[names.STATUS_FAILED],
        n_pruned=count[names.STATUS_PRUNED],
        n_running=len(trials) - sum(count.values()),
        tokens_per_s_mean=tps[0], tokens_per_s_std=tps[1], tokens_per_s_per_device=per_device[0],
        hardware=" | ".join(dict.fromkeys(t.device_types for t in trials if t.device_types)),
        mfu_mean=mfu[0], mfu_std=mfu[1],
        peak_mem_gb=max(peaks) if peaks else None,
        final_val_loss_mean=val[0], final_val_loss_std=val[1],
        final_tokens_mean=tokens,
        skipped_steps=_final_counter(trials, names.SKIPPED_STEPS),
        nonfinite_steps=_final_counter(trials, names.NONFINITE_STEPS),
        loss_spikes=_final_counter(trials, names.LOSS_SPIKES),
        diverged_steps=tuple(sorted(t.diverged_step for t in trials if t.diverged_step is not None)),
        pruned_steps=tuple(sorted(t.pruned_step for t in trials
                                  if t.status == names.STATUS_PRUNED and t.pruned_step is not None)),
        max_grad_norm=max(grads) if grads else None,
        max_underflow=max(under) if under else None,
        max_overflow=max(over) if over else None,
    )


def _div(x: float | None, n: int) -> float | None:
    return None if x is None else x / n


def _max_over(trial: Trial, stat: str) -> float | None:
    """Largest sampled value of a cast statistic over every tensor kind and sample."""
    values = [curves.max_finite(trial.series(names.cast_max_metric(kind, stat)))
              for kind in names.CAST_TENSORS]
    values = [v for v in values if v is not None]
    return max(values) if values else None


def verdict(row: ConfigRow, *, base_val_loss: float | None, tolerance: float) -> str:
    """One word a reader can sort by: is this configuration as good as the baseline?"""
    if row.is_baseline:
        return "baseline"
    if row.n_trials and row.n_failed == row.n_trials:
        return "failed"
    if row.n_diverged:
        return "diverged"
    if row.n_trials and row.n_pruned == row.n_trials:
        return "pruned"
    if row.delta_val_loss is None or base_val_loss is None:
        return "-"
    return "degraded" if row.delta_val_loss > tolerance * base_val_loss else "ok"


def delta_at_equal_tokens(row: ConfigRow, baseline_trials: Sequence[Trial]) -> float | None:
    """row's mean final val loss - the baseline's mean val loss curve at row's mean final tokens."""
    if row.final_val_loss_mean is None or row.final_tokens_mean is None:
        return None
    base_curves = [t.series(names.by_tokens(names.VAL_LOSS)) for t in baseline_trials]
    at = curves.mean_curve_at([c for c in base_curves if c], row.final_tokens_mean)
    return None if at is None else row.final_val_loss_mean - at


def _resolve_baseline(rows: Sequence[ConfigRow], baseline: str | None) -> str | None:
    if baseline is None:
        return default_baseline(rows)
    by_label = {r.label: r for r in rows}
    known = ", ".join(by_label) or "none"
    if baseline not in by_label:
        raise ValueError(f"baseline {baseline!r} is not a configuration of this sweep; "
                         f"pass one of: {known}")
    if not by_label[baseline].has_numbers:
        raise ValueError(f"baseline {baseline!r} has no finished trial to compare against; "
                         f"pass another --baseline (configurations: {known})")
    return baseline


def _with_front(rows: list[ConfigRow], groups: dict[str, list[Trial]],
                objectives: Sequence[Objective]) -> tuple[list[ConfigRow], tuple[str, ...]]:
    """The rows with their objective values and Pareto flags, and the front; the rows as they are
    where the sweep has no front. Neither depends on the baseline."""
    if not pareto.has_front(objectives):
        return rows, ()
    rows = [replace(r, objective_values=pareto.objective_means(groups[r.label], objectives)) for r in rows]
    front = pareto.front(rows, objectives)
    return [replace(r, pareto=r.label in front) for r in rows], front


def summarize(trials: Sequence[Trial], *, baseline: str | None = None,
              target_loss: float | None = None, tolerance: float = TOLERANCE,
              objectives: Sequence[Objective] = ()) -> Summary:
    """Aggregate trials per configuration label and compare each to the baseline.

    baseline: a configuration label; default: see default_baseline. target_loss: the loss
    for "tokens to target"; default: the baseline's mean final val loss x TARGET_FACTOR.
    tolerance: Δ val loss, as a fraction of the baseline's, above which a row is degraded.
    objectives: what the trials returned to their sweeper (SweepData.objectives); with two or
    more, the rows carry their values and the Pareto front (compare.pareto).
    """
    if target_loss is not None and not math.isfinite(target_loss):
        raise ValueError(f"target loss must be a finite number, got {target_loss!r}")
    groups: dict[str, list[Trial]] = {}
    for t in trials:
        groups.setdefault(t.label, []).append(t)
    rows = [_base_row(label, ts) for label, ts in groups.items()]
    rows.sort(key=lambda r: (precision_rank(r.precision), r.label))
    rows, front = _with_front(rows, groups, objectives)
    study = {"objectives": tuple(objectives), "pareto_front": front}
    base_label = _resolve_baseline(rows, baseline)
    notes: list[str] = []
    if base_label is None:
        notes.append("no configuration has a finished trial: no baseline, speedup or Δ")
        return _answered(Summary(rows=tuple(rows), baseline=None, target_loss=target_loss,
                                 target_source="given" if target_loss is not None else "none",
                                 notes=tuple(notes), repro=reproducibility(trials), **study))

    base = next(r for r in rows if r.label == base_label)
    base_trials = [t for t in groups[base_label] if t.status == names.STATUS_FINISHED]
    source = "given"
    if target_loss is None and base.final_val_loss_mean is not None:
        target_loss = base.final_val_loss_mean * TARGET_FACTOR
        source = f"baseline's mean final val loss x {TARGET_FACTOR:g}"
    elif target_loss is None:
        source = "none (the baseline logged no val loss)"

    out = []
    for r in rows:
        done = [t for t in groups[r.label] if t.status == names.STATUS_FINISHED]
        measured: list[Trial] = []
        reached: list[float] = []
        if target_loss is not None:
            measured = [t for t in done if t.series(names.by_tokens(names.VAL_LOSS))]
            reached = _values(measured, lambda t: tokens_to_target(t, target_loss))
        speedup = None
        if r.tokens_per_s_mean is not None and base.tokens_per_s_mean:
            speedup = r.tokens_per_s_mean / base.tokens_per_s_mean
        row = replace(
            r, is_baseline=r.label == base_label, speedup=speedup,
            delta_val_loss=delta_at_equal_tokens(r, base_trials),
            tokens_to_target_mean=curves.mean_std(reached)[0],
            n_reached_target=len(reached), n_target_measured=len(measured))
        out.append(replace(row, verdict=verdict(row, base_val_loss=base.final_val_loss_mean,
                                                 tolerance=tolerance)))
    return _answered(Summary(rows=tuple(out), baseline=base_label, target_loss=target_loss,
                             target_source=source, notes=tuple(notes), repro=reproducibility(trials), **study))


def _answered(summary: Summary) -> Summary:
    """The summary with its answer (compare.answer), computed here once for every reader."""
    return replace(summary, answer=answer(summary))
