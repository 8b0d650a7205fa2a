"""A multirun as a study: what its sweeper is, and what each trial returns to it; checked on the
driver before the first trial starts.

    trainlab train -m hydra/sweeper=optuna hydra.sweeper.n_trials=12 hydra.sweeper.n_jobs=2 \
        'optim.lr=interval(1e-4,1e-2)' precision=fp32,bf16 \
        hydra.launcher.objective=[val_loss,tokens_per_s] 'hydra.sweeper.direction=[minimize,maximize]'

Hydra's sweeper (basic grid, Optuna, Nevergrad, Ax, ...) proposes the jobs and hands them to the
launcher one batch at a time; the launcher makes the whole multirun one study (launch.study): one
parent run, one gang pool, one pruner. The keys sit in hydra.launcher beside max_concurrent_trials,
as the launcher's other settings do; the objectives themselves are vocab.objectives'.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainlab.config.prune_rule import SECTION, max_tokens, validates_on_the_way
from trainlab.config.schema import RunConfig
from trainlab.vocab.objectives import DEFAULT_OBJECTIVE, Objective, objective

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
OPTUNA_SWEEPER = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
STUDY_STORAGE = "trainlab.launch.optuna_storage.StudyStorage"
"""The storage trainlab gives Hydra's Optuna sweeper (launch.optuna_storage): its study in memory,
as by default, shared with the launcher so that prunes are told PRUNED and curves reported."""
_SWEEPER_NAMES = {"BasicSweeper": "basic", "OptunaSweeper": "optuna", "NevergradSweeper": "nevergrad",
                  "AxSweeper": "ax"}


@dataclass(frozen=True)
class SweeperInfo:
    """What proposes the study's trials (config.hydra.sweeper, read once)."""

    target: str
    """Its _target_ (BASIC_SWEEPER, hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper, ...)."""
    sampler: str = "grid"
    """Its sampler's or optimizer's class name; `grid` for the basic sweeper."""
    seed: int | None = None
    """The sampler's seed; None when unseeded (a rerun then proposes other trials)."""
    directions: tuple[str, ...] = ()
    """hydra.sweeper.direction, one per objective ("minimize" | "maximize"); () when it has none."""
    n_trials: int | None = None
    batch_size: int | None = None
    """Trials per batch (Optuna's n_jobs, the basic sweeper's max_batch_size); None = all at once."""

    @property
    def name(self) -> str:
        cls = self.target.rsplit(".", 1)[-1]
        return _SWEEPER_NAMES.get(cls, cls)

    @property
    def searches(self) -> bool:
        """Its later batches depend on the results of earlier ones (not a grid)."""
        return self.target != BASIC_SWEEPER

    def tags(self) -> dict[str, str]:
        return {"sweeper": self.name, "sampler": self.sampler,
                "sweeper_seed": "none" if self.seed is None else str(self.seed),
                **({"direction": ",".join(self.directions)} if self.directions else {})}

    def identity(self) -> dict:
        """What makes two multiruns the same study (the parent's sweep_id): n_trials stays out, so
        a rerun with more trials continues the study it extends."""
        return {"sweeper": self.target, "sampler": self.sampler, "seed": self.seed,
                "directions": list(self.directions), "batch_size": self.batch_size}


def storage_override(cfg: Any) -> str | None:
    """The override `trainlab train -m` adds for Hydra's Optuna sweeper when hydra.sweeper.storage
    is unset (a storage the user gives is theirs, and stays: its prunes then reach Optuna as the
    val loss they reached, COMPLETE); None for every other sweeper."""
    sweeper = cfg.hydra.get("sweeper") if cfg is not None else None
    if sweeper is None or sweeper.get("_target_") != OPTUNA_SWEEPER or sweeper.get("storage") is not None:
        return None
    return f"hydra.sweeper.storage={{_target_:{STUDY_STORAGE}}}"


def _name_of(node: Any) -> str:
    target = str(getattr(node, "_target_", None) or (node.get("_target_") if hasattr(node, "get") else "") or "")
    return target.rsplit(".", 1)[-1] or "default"


def sweeper_info(sweeper: Any) -> SweeperInfo:
    """The SweeperInfo of a hydra.sweeper node (Hydra's DictConfig, or a mapping)."""
    get = sweeper.get if hasattr(sweeper, "get") else (lambda k, d=None: getattr(sweeper, k, d))
    target = str(get("_target_", "") or BASIC_SWEEPER)
    if target == BASIC_SWEEPER:
        size = get("max_batch_size", None)
        return SweeperInfo(target=target, batch_size=int(size) if size else None)
    sampler = get("sampler", None) or get("optim", None)
    seed = None
    if sampler is not None:
        seed = sampler.get("seed") if hasattr(sampler, "get") else getattr(sampler, "seed", None)
    direction = get("direction", None)
    if direction is None:
        directions: tuple[str, ...] = ()
    elif isinstance(direction, str) or hasattr(direction, "name"):  # one: a string or Optuna's Direction enum
        directions = (_direction_name(direction),)
    else:
        directions = tuple(_direction_name(d) for d in direction)
    n_trials, n_jobs = get("n_trials", None), get("n_jobs", None)
    return SweeperInfo(target=target, sampler=_name_of(sampler) if sampler is not None else "default",
                       seed=None if seed is None else int(seed), directions=directions,
                       n_trials=None if n_trials is None else int(n_trials),
                       batch_size=None if n_jobs is None else int(n_jobs))


def _direction_name(d: Any) -> str:
    return str(getattr(d, "name", d))


@dataclass(frozen=True)
class StudyConfig:
    """hydra.launcher's study keys."""

    objective: tuple[str, ...] = DEFAULT_OBJECTIVE
    """What each trial returns to the sweeper, in order (vocab.objectives): one a float, several a list."""
    objective_tokens: int = 0
    """val_loss: the tokens at which every trial's val loss is read (its curve interpolated there,
    so batch sizes may differ); 0 = each trial's last validation."""
    target_loss: float | None = None
    """time_to_loss: the val loss a trial must reach."""

    def __post_init__(self) -> None:
        names = (self.objective,) if isinstance(self.objective, str) else tuple(self.objective)
        if not names:
            raise ValueError(f"{SECTION}.objective=[] names no objective; give one or several, e.g. "
                             f"{SECTION}.objective=[val_loss] (the default)")
        object.__setattr__(self, "objective", names)
        for n in names:
            objective(n)  # ValueError naming the known ones
        if len(set(names)) < len(names):
            raise ValueError(f"{SECTION}.objective={list(names)} names an objective twice; give each once")
        if self.objective_tokens < 0:
            raise ValueError(f"{SECTION}.objective_tokens={self.objective_tokens} is negative; give the tokens at "
                             f"which val losses are compared, or 0 (each trial's last validation)")
        if "time_to_loss" in names:
            if self.target_loss is None or not math.isfinite(self.target_loss):
                raise ValueError(f"{SECTION}.objective=time_to_loss needs the loss to reach: set "
                                 f"{SECTION}.target_loss (a val loss, e.g. {SECTION}.target_loss=3.5)")

    @property
    def objectives(self) -> tuple[Objective, ...]:
        return tuple(objective(n) for n in self.objective)


def study_config(launcher: Any) -> StudyConfig:
    """The StudyConfig of a launcher node (DictConfig or the launcher itself); ValueError naming
    the key. A launcher without the keys (hydra/launcher=basic) returns the val loss."""
    values = {}
    for f in dataclasses.fields(StudyConfig):
        v = getattr(launcher, f.name, None)
        if v is not None:
            values[f.name] = tuple(v) if f.name == "objective" and not isinstance(v, str) else v
    return StudyConfig(**values)


def check_study(study: StudyConfig, sweeper: SweeperInfo, runs: Sequence[RunConfig], labels: Sequence[str]) -> None:
    """The objectives fit the sweeper and the trials: a sweeper with directions has one per
    objective, each the objective's own; val_loss at objective_tokens needs every trial to train
    that far and to validate on the way. ValueError with the fix."""
    objectives = study.objectives
    if sweeper.directions:
        wanted = [o.direction for o in objectives]
        if list(sweeper.directions) != wanted:
            fix = f"[{','.join(wanted)}]" if len(wanted) > 1 else wanted[0]
            raise ValueError(
                f"hydra.sweeper.direction={list(sweeper.directions)} does not match {SECTION}.objective="
                f"{list(study.objective)}: " + ", ".join(f"{o.name} is to {o.direction}" for o in objectives)
                + f"; set 'hydra.sweeper.direction={fix}'")
    elif len(objectives) > 1 and sweeper.searches:
        raise ValueError(f"{SECTION}.objective={list(study.objective)} returns {len(objectives)} values, but "
                         f"hydra/sweeper={sweeper.name} takes one; give {SECTION}.objective one objective")
    if study.objective_tokens and "val_loss" in study.objective:
        for run, label in zip(runs, labels):
            if max_tokens(run) < study.objective_tokens:
                raise ValueError(
                    f"{SECTION}.objective_tokens={study.objective_tokens} is past the end of job {label}, which "
                    f"trains {max_tokens(run)} tokens; set {SECTION}.objective_tokens at or below the shortest "
                    f"trial's tokens, or 0 (each trial's last validation)")
            if not validates_on_the_way(run):
                raise ValueError(
                    f"{SECTION}.objective_tokens={study.objective_tokens} reads job {label}'s val loss on its "
                    f"way, but it validates only at its end (train.eval_every={run.train.eval_every}); set "
                    f"train.eval_every={max(1, run.train.max_steps // 10)} or {SECTION}.objective_tokens=0")
