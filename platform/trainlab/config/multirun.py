"""A command line's jobs, composed and validated as `trainlab train` would run them, nothing run.

    jobs = expand_jobs(["-m", "+sweep=precision_shootout", "model=tiny"])   # [Job(overrides, run), ...]

Without -m: one job, the command line composed as `trainlab train` composes it. With -m: the
jobs Hydra's basic sweeper makes (hydra.sweeper.params of the composed config, e.g. a sweep
file's, then the command line's overrides, later keys winning; the cartesian product of every
swept key, in Hydra's order), each composed with Hydra's compose API and checked by
to_run_config. Errors are `trainlab train`'s: config.overrides.check_overrides' one line first,
then every invalid job named at once.

Another sweeper proposes its trials itself. Hydra's Optuna sweeper's are listed as far as they are
known before any runs (config.optuna_trials: a grid's every point, a seeded sampler's first
batch, ...), with a line saying which they are; any other sweeper (Nevergrad, Ax, ...) is refused
in one line naming one point of its space to estimate instead.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from trainlab.config.compose_cache import reuse_compositions
from trainlab.config.convert import CONF_DIR, ConfigError, to_run_config
from trainlab.config.optuna_trials import optuna_proposal
from trainlab.config.overrides import _MULTIRUN_FLAGS, BASIC_SWEEPER, check_overrides, hydra_error_message
from trainlab.config.schema import RunConfig, register_configs
from trainlab.config.study_rule import OPTUNA_SWEEPER, sweeper_info


@dataclass(frozen=True)
class Job:
    overrides: tuple[str, ...]
    """The job's overrides as Hydra hands them to the launcher (the sweep's params first)."""
    run: RunConfig


@dataclass(frozen=True)
class Sweep:
    """A command line's jobs as far as they are known before any runs, and what they are of it."""

    jobs: list[Job]
    num_trials: int
    """How many trials it runs in all: len(jobs), but for a search sweeper (more: a first batch;
    fewer: a grid of which it runs n_trials, picked at random)."""
    note: str = ""
    """One line saying what the jobs are of a search sweeper's trials; "" for the basic sweeper."""


def expand_jobs(args: Sequence[str], *, config_name: str = "config",
                check: Callable[[RunConfig], object] | None = None) -> list[Job]:
    """Every job of the command line `args` (as after `trainlab train`), validated; ConfigError
    naming the key, the value and the fix, or every invalid job of a sweep. `check`: what the
    caller asks of each job's RunConfig besides (the estimate command: plan.derive_layout.plan_layout),
    its ConfigError counted as the job's. A search sweeper's: the jobs expand_sweep knows."""
    return expand_sweep(args, config_name=config_name, check=check).jobs


def expand_sweep(args: Sequence[str], *, config_name: str = "config",
                 check: Callable[[RunConfig], object] | None = None) -> Sweep:
    """expand_jobs' jobs with how many trials the sweeper runs and, for a search sweeper, the line
    saying which of them they are."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    check_overrides(args, folders=False)  # the same one-line refusals as `trainlab train`
    multirun = any(a in _MULTIRUN_FLAGS for a in args)
    texts = [a for a in args if a not in _MULTIRUN_FLAGS]
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        loader = reuse_compositions(GlobalHydra.instance().hydra.config_loader)  # jobs differing in values: one compose
        parser = OverridesParser.create(config_loader=loader)
        jobs, num_trials, note = [texts], None, ""
        if multirun:
            fixed = [o.input_line for o in parser.parse_overrides(texts) if not o.is_sweep_override()]
            try:
                master = compose(config_name=config_name, overrides=fixed, return_hydra_config=True)
            except (HydraException, OmegaConfBaseException) as e:
                raise ConfigError(hydra_error_message(e, fixed)) from None
            sweeper = master.hydra.sweeper
            if sweeper.get("_target_") == OPTUNA_SWEEPER:  # handed the task overrides, as Hydra's multirun does
                proposal = optuna_proposal(sweeper, config=master, arguments=[
                    o.input_line for o in parser.parse_overrides(texts) if not o.is_hydra_override()])
                jobs, num_trials, note = proposal.overrides, proposal.num_trials, proposal.note
            elif sweeper.get("_target_") != BASIC_SWEEPER:
                raise ConfigError(unlisted_sweeper_message(sweeper, texts))
            else:
                params = OmegaConf.to_container(sweeper.get("params") or OmegaConf.create())
                # Hydra's BasicSweeper.sweep: the config's params, then the command line's arguments
                parsed = parser.parse_overrides([f"{k}={v}" for k, v in params.items()] + texts)
                try:
                    jobs = BasicSweeper.split_arguments(parsed, None)[0]
                except HydraException as e:
                    raise ConfigError(f"{e}; sweep with comma lists (a=1,2) or range(...)") from None
        out, errors = [], []
        for i, overrides in enumerate(jobs):
            try:
                cfg = compose(config_name=config_name, overrides=list(overrides))
                with open_dict(cfg):
                    cfg.pop("hydra", None)
                run = to_run_config(cfg)
                if check is not None:
                    check(run)
                out.append(Job(overrides=tuple(overrides), run=run))
            except ConfigError as e:
                errors.append((i, overrides, str(e)))
            except (HydraException, OmegaConfBaseException) as e:
                errors.append((i, overrides, hydra_error_message(e, overrides)))
    if errors and not multirun:
        raise ConfigError(errors[0][2])
    if errors:  # as launch.sweep refuses a sweep with invalid jobs
        raise ConfigError("the sweep has invalid jobs; nothing was estimated:\n  " + "\n  ".join(
            f"job #{i} ({' '.join(o)}): {msg}" for i, o, msg in errors))
    return Sweep(jobs=out, num_trials=len(out) if num_trials is None else num_trials, note=note)


def unlisted_sweeper_message(sweeper: Any, texts: Sequence[str]) -> str:
    """Why a search sweeper other than Optuna's has no jobs to list, with one point of its space
    to estimate instead: the command line's fixed overrides, each swept key (hydra.sweeper.params,
    then the command line's) at its first value, an interval at its low end."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    info = sweeper_info(sweeper)
    params = sweeper.get("params")
    lines = [f"{k}={v}" for k, v in params.items()] if hasattr(params, "items") else []
    point: dict[str, str] = {}
    parser = OverridesParser.create()
    for line in [*lines, *texts]:
        try:
            (o,) = parser.parse_overrides([line])
        except HydraException:  # not Hydra's grammar (the sweeper's own): a placeholder
            point[line.partition("=")[0]] = f"{line.partition('=')[0]}=VALUE"
            continue
        if o.is_hydra_override():
            continue
        point[o.get_key_element()] = f"{o.get_key_element()}={_a_value(o)}" if o.is_sweep_override() else o.input_line
    return (f"hydra/sweeper={info.name} ({info.target}): its trials depend on the results of earlier ones, so "
            "they cannot be listed before they run (only Hydra's basic and Optuna sweepers' can); estimate one "
            f"point of its space instead: trainlab estimate {shlex.join(point.values())}")


def _a_value(o: Any) -> str:
    """One value of a sweep override: its first, or an interval's low end."""
    from hydra.errors import HydraException

    if o.is_interval_sweep():
        return str(o.value().start)
    try:
        return next(iter(o.sweep_string_iterator()), "VALUE")
    except HydraException:  # a glob needs the config repository: the user picks
        return "VALUE"
