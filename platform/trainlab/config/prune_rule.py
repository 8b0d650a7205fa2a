"""hydra.launcher.prune: the rule that stops a sweep's hopeless trials early, checked before
anything starts.

    trainlab train -m optim.lr=1e-4,1e-3,1e-2 hydra.launcher.prune=asha
    trainlab train -m ... hydra.launcher.prune=margin hydra.launcher.prune_margin=0.05

The keys sit flat beside max_concurrent_trials in the launcher's node, as Hydra's launcher
plugins keep theirs; their names follow Ray Tune's ASHAScheduler (grace_period,
reduction_factor) with the unit spelt out: trials are compared at equal tokens seen, since
they may differ in batch size. The rules themselves are launch.pruner's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainlab.config.bounds import bounded, check_fields, check_value
from trainlab.config.schema import RunConfig

SECTION = "hydra.launcher"
OPTUNA_PRUNERS = ("median", "successive_halving", "hyperband")
"""Optuna's pruners, run by the launcher over the multirun's curves (launch.optuna_pruner)."""
PRUNE_RULES = ("none", "margin", "asha", *OPTUNA_PRUNERS)
_USES = {"prune_margin": ("margin",), "prune_grace_tokens": ("margin", "asha", *OPTUNA_PRUNERS),
         "prune_reduction_factor": ("asha", "successive_halving", "hyperband"),
         "prune_startup_trials": ("median",)}
"""Which rules read each knob (the others ignore it, with a warning)."""


@dataclass(frozen=True)
class PruneConfig:
    prune: str = "none"
    """none: a trial stops early only when it diverges (train.stop_on_nonfinite, as always);
    margin: when its val loss is worse than the best trial's at equal tokens by more than
    prune_margin, after prune_grace_tokens; asha: asynchronous successive halving (Ray Tune's
    ASHAScheduler, one bracket) with rungs at prune_grace_tokens x prune_reduction_factor^k;
    median, successive_halving, hyperband: Optuna's pruners over the same curves, at equal tokens."""
    prune_margin: float = bounded(0.1, ge=0, note="a fraction of the best val loss: 0.1 = 10 % worse")
    prune_grace_tokens: int = bounded(0, ge=0, note="0 = a quarter of the sweep's shortest trial")
    """Tokens a trial trains before margin may stop it; asha's first rung."""
    prune_reduction_factor: float = bounded(4.0, gt=1, why="a rung keeps the best 1/factor of the trials "
                                                           "that reached it, and rungs are factor apart")
    prune_startup_trials: int = bounded(5, ge=0, note="trials that end before median prunes any")

    def __post_init__(self) -> None:
        check_value(f"{SECTION}.prune", self.prune, kind=str)
        if self.prune not in PRUNE_RULES:
            raise ValueError(f"{SECTION}.prune={self.prune} is not a pruning rule; set {SECTION}.prune to one of "
                             f"{', '.join(PRUNE_RULES)} (none: only a divergence stops a trial early)")
        if self.prune in OPTUNA_PRUNERS:
            try:
                import optuna  # noqa: F401
            except ImportError:
                raise ValueError(f"{SECTION}.prune={self.prune} is Optuna's pruner, and optuna is not installed; "
                                 "pip install hydra-optuna-sweeper (it brings optuna), or use "
                                 f"{SECTION}.prune=asha (the same idea, no Optuna)") from None
        check_fields(self, section=SECTION)

    @property
    def enabled(self) -> bool:
        return self.prune != "none"

    def ignored(self) -> list[str]:
        """Knobs set away from their default that the chosen rule does not read."""
        defaults = PruneConfig()
        return [f"{SECTION}.{k}={getattr(self, k)} is ignored: {SECTION}.prune={self.prune} does not use it "
                f"(it is for {' and '.join(f'prune={r}' for r in rules)})"
                for k, rules in _USES.items()
                if self.prune not in rules and getattr(self, k) != getattr(defaults, k)]


def prune_config(launcher: Any) -> PruneConfig:
    """The PruneConfig of a launcher node (Hydra's DictConfig or the launcher itself): ValueError
    naming the key, the value and the fix. A launcher without the keys (hydra/launcher=basic)
    prunes nothing."""
    values = {f.name: getattr(launcher, f.name) for f in dataclasses.fields(PruneConfig)
              if getattr(launcher, f.name, None) is not None}
    return PruneConfig(**values)


def validates_on_the_way(run: RunConfig) -> bool:
    """The trial validates before its last step (what pruning and val loss at equal tokens read)."""
    return bool(run.train.eval_interval) and run.train.eval_interval < run.train.max_steps


def max_tokens(run: RunConfig) -> int:
    """Tokens a trial sees by its last step (every rank's share of the global batch)."""
    return run.train.max_steps * run.train.global_batch_size * run.train.seq_len


def grace_tokens(config: PruneConfig, runs: Sequence[RunConfig]) -> int:
    """prune_grace_tokens, or for 0 a quarter of the shortest trial's tokens."""
    return config.prune_grace_tokens or max(1, min(max_tokens(r) for r in runs) // 4)


def check_prunable(config: PruneConfig, runs: Sequence[RunConfig], labels: Sequence[str]) -> None:
    """The sweep's jobs can be pruned as configured: every trial validates while it trains (the
    rules compare val losses) and the grace ends before the longest trial does. ValueError."""
    if not config.enabled or not runs:
        return
    for run, label in zip(runs, labels):
        if not validates_on_the_way(run):
            every = max(1, run.train.max_steps // 10)
            raise ValueError(
                f"{SECTION}.prune={config.prune} compares the trials' val losses while they train, but job "
                f"{label} validates only at its end (train.eval_every={run.train.eval_every}, "
                f"train.max_steps={run.train.max_steps}); set train.eval_every={every} or leave it out "
                f"(-1, auto) (or {SECTION}.prune=none)")
    longest = max(max_tokens(r) for r in runs)
    if config.prune_grace_tokens >= longest:
        raise ValueError(
            f"{SECTION}.prune_grace_tokens={config.prune_grace_tokens} is at or past the end of every trial (the "
            f"longest sees {longest} tokens): nothing would be pruned; set {SECTION}.prune_grace_tokens below "
            f"{longest}, or to 0 (a quarter of the shortest trial)")
