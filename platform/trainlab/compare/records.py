"""Plain data that compare works on: trials as read from MLflow, and the summary rows.

Nothing here touches MLflow, so the summary can be computed (and tested) from hand-built
trials; `read_sweep.py` is the only module that turns MLflow runs into these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trainlab.vocab.objectives import Objective

Series = tuple[tuple[int, float], ...]
"""A metric history as (step, value) pairs, sorted by step, one value per step."""


@dataclass(frozen=True)
class Trial:
    """One child run of a sweep: its identifying tags and the metric histories compare needs."""

    run_id: str
    label: str  # names.TAG_CONFIG_LABEL: the unit seeds are aggregated over
    status: str  # names.STATUS_*
    seed: str = ""
    precision: str = ""
    run_name: str = ""
    diverged_step: int | None = None
    error: str = ""
    pruned_step: int | None = None  # status pruned: names.TAG_PRUNED_STEP, the last step it trained
    pruned_reason: str = ""  # names.TAG_PRUNED_REASON: why hydra.launcher.prune stopped it
    # which job this run is an attempt of (config hash): a sweep rerun retries failed jobs
    # under the same parent, and only the latest attempt counts
    attempt_key: str = ""
    device_types: str = ""  # names.TAG_DEVICE_TYPES: what the workers ran on, e.g. 'H100:2,V100:2'
    world_size: int = 0  # workers (devices) of the trial
    metrics: Mapping[str, Series] = field(default_factory=dict)
    params: Mapping[str, str] = field(default_factory=dict)
    """The flattened config as MLflow params ('train.max_steps' -> '200'): which runs should match."""
    params_sha: str = ""  # names.TAG_PARAMS_SHA; empty for runs from before the checksums
    loss_curve_sha: str = ""  # names.TAG_LOSS_CURVE_SHA
    est_bound: str = ""  # names.TAG_EST_BOUND: what its estimate said limits it ('' = not estimated)
    est_calibration: str = ""  # names.TAG_EST_CALIBRATION

    def series(self, key: str) -> Series:
        """The history of metric `key`; empty when the trial never logged it."""
        return self.metrics.get(key, ())


@dataclass(frozen=True)
class SweepData:
    """A sweep's parent run and all of its trials."""

    name: str  # the sweep's name (parent's names.TAG_SWEEP, else the experiment's name)
    experiment_name: str
    experiment_id: str
    parent_run_id: str
    tracking_uri: str
    trials: tuple[Trial, ...]
    n_parents: int = 1  # parent runs that matched the selector; the most recent was taken
    note: str = ""  # said to the user, e.g. which of several parent runs was taken
    objectives: tuple[Objective, ...] = ()
    """What its trials returned to the sweeper (the parent's names.TAG_OBJECTIVE), in order; () for a
    sweep that names none. With two or more, compare marks the Pareto front (compare.pareto)."""


@dataclass(frozen=True)
class ConfigRow:
    """One configuration (label) with its seeds aggregated; None where there is no number.

    Numbers (throughput, memory, losses) come from finished trials only: a diverged run's
    last val loss or a failed run's partial throughput would mislead. Stability columns
    (counters, divergence steps, max grad norm) cover every trial, since that is their point.
    """

    label: str
    precision: str
    is_baseline: bool
    n_trials: int
    n_finished: int
    n_diverged: int
    n_failed: int
    n_running: int
    n_pruned: int = 0  # stopped early by hydra.launcher.prune (a result, not a failure)
    tokens_per_s_mean: float | None = None
    tokens_per_s_std: float | None = None
    tokens_per_s_per_device: float | None = None  # each trial's tokens/s / its world size, mean
    hardware: str = ""  # the distinct device_types of its trials, ' | '-separated
    speedup: float | None = None  # tokens_per_s_mean / the baseline's
    mfu_mean: float | None = None  # a fraction of peak (0.41 = 41 %)
    mfu_std: float | None = None
    peak_mem_gb: float | None = None  # max over trials and steps
    final_val_loss_mean: float | None = None
    final_val_loss_std: float | None = None
    final_tokens_mean: float | None = None  # tokens seen at the last validation
    delta_val_loss: float | None = None  # see summarize.delta_at_equal_tokens
    tokens_to_target_mean: float | None = None  # over the trials that reached the target
    n_reached_target: int = 0
    n_target_measured: int = 0  # finished trials with a by-tokens val loss curve
    skipped_steps: int | None = None
    nonfinite_steps: int | None = None
    loss_spikes: int | None = None
    diverged_steps: tuple[int, ...] = ()
    pruned_steps: tuple[int, ...] = ()  # where its pruned trials stopped
    max_grad_norm: float | None = None
    max_underflow: float | None = None  # largest sampled underflow fraction of any cast
    max_overflow: float | None = None  # largest sampled saturated/overflowed fraction
    verdict: str = ""  # see summarize.verdict
    objective_values: tuple[float | None, ...] = ()
    """One per Summary.objectives (a study of several): the mean over its finished and pruned trials
    of what each returned to the sweeper (compare.pareto.objective_means); () otherwise."""
    pareto: bool | None = None
    """On the study's Pareto front; None where the sweep has no front (fewer than two objectives)."""

    @property
    def has_numbers(self) -> bool:
        """False for configurations where every trial failed, diverged, was pruned or is still running."""
        return self.n_finished > 0


@dataclass(frozen=True)
class Answer:
    """The sweep's result: the winner (None when no configuration is ok) and its numbers."""

    line: str
    """One sentence for a person: the winner with its speedup and val-loss gap, or why none."""
    best: str | None = None  # the winner's configuration label
    baseline: str | None = None
    speedup: float | None = None  # the winner's tokens/s / the baseline's
    val_loss: float | None = None  # the winner's mean final val loss
    delta_val_loss: float | None = None  # vs the baseline at equal tokens (negative = better)
    trials_by_status: tuple[tuple[str, int], ...] = ()
    """Trials per status (names.STATUS_* and compare.answer.UNFINISHED) over every configuration,
    zeros included; a rerun job counts once (its latest attempt, as compare.read_sweep reads it)."""
    pareto_front: tuple[str, ...] | None = None
    """The labels on the Pareto front (Summary.pareto_front); None where the sweep has no front."""
    pareto_line: str = ""
    """The line after `line` naming the front (compare.pareto.front_line); "" without a front."""


@dataclass(frozen=True)
class Summary:
    """The table: rows in display order, with the baseline and target they were computed for."""

    rows: tuple[ConfigRow, ...]
    baseline: str | None  # None when no configuration has a finished trial
    target_loss: float | None
    target_source: str  # how target_loss was chosen, for the reader of the report
    notes: tuple[str, ...] = ()
    repro: tuple = ()  # compare.repro.ReproGroup: runs that should match, and whether they do
    answer: Answer | None = None
    """The fastest ok configuration (compare.answer), computed once by summarize for everyone who
    prints, writes or logs it; None only inside summarize, before it is computed."""
    objectives: tuple[Objective, ...] = ()  # the study's (SweepData.objectives)
    pareto_front: tuple[str, ...] = ()
    """The labels of the rows on the Pareto front, best first on the first objective (compare.pareto.front);
    () where there is no front (compare.pareto.has_front) or no configuration has every value."""

    def row(self, label: str) -> ConfigRow:
        """The row of configuration `label`."""
        for r in self.rows:
            if r.label == label:
                return r
        known = ", ".join(r.label for r in self.rows)
        raise ValueError(f"no configuration {label!r} in this summary; configurations: {known}")
