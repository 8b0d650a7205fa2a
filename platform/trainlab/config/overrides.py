"""Command-line overrides checked before the Hydra app runs.

Hydra reports a bad override (unknown key or group option, a value of the wrong type) itself,
in several lines with its config search path, and exits 1 like any failure. `trainlab train`
composes the overrides once beforehand, and turns Hydra's error into the platform's own: one
`error:` line naming the key, the value and the fix, and exit status 2 (bad input), before
anything starts. A single run's composed config then goes through to_run_config here as well
(unknown keys added with `+`, every field's range, the cross-field checks), so a refused value
leaves no Hydra run folder behind; a multirun's jobs are checked by its launcher, job by job.
The folder Hydra will make is proven writable, and group options kept to the config tree
(trainlab.config.folders, trainlab.config.override_hints).
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Sequence

from trainlab.config.compose_cache import reuse_compositions
from trainlab.config.convert import (
    CONF_DIR,
    SWEEPS_DIR,
    ConfigError,
    check_config_files,
    to_run_config,
    unknown_key_message,
)
from trainlab.config.folders import check_hydra_folder
from trainlab.config.moved import moved_schema_message
from trainlab.config.optuna_trials import optuna_proposal
from trainlab.config.override_hints import check_group_options, default_of, unreadable_override_message
from trainlab.config.schema import GROUPS, RunConfig, register_configs
from trainlab.config.study_rule import OPTUNA_SWEEPER
from trainlab.config.sweep_limits import check_keep_warm, check_launcher_limits, check_sweep_size
from trainlab.console import warn

# Hydra flags after which the arguments are not a plain run or sweep: left to Hydra alone
_HYDRA_ONLY_FLAGS = ("-h", "--help", "--hydra-help", "--info", "-c", "--cfg", "-p", "--package",
                     "-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir",
                     "-sc", "--shell-completion", "--version", "--experimental-rerun", "--resolve")
_MULTIRUN_FLAGS = ("-m", "--multirun")
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def check_overrides(args: Sequence[str], *, folders: bool = True,
                    check_run: Callable[[RunConfig], None] | None = None, warn_duplicates: bool = True) -> Any:
    """Compose conf/ with the command line's overrides as Hydra will; ConfigError with one clear
    line if Hydra refuses them. In a multirun the swept keys are left to each job's check.
    `folders=False`: a command that writes no Hydra folder (`trainlab estimate`) skips their check.
    `check_run`: the caller's further check of a single run's typed config (the command passes
    the plan's layout check, which lives above this layer), ConfigError to refuse it.
    `warn_duplicates=False`: the caller put defaults of its own before the user's overrides.
    Returns the config composed from the fixed overrides (Hydra's node included), None where the
    command line only asks Hydra something (--help, --cfg, ...)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:  # before Hydra reads any of them, whichever flags follow
        check_config_files(_config_dirs(args))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if any(a.split("=")[0] in _HYDRA_ONLY_FLAGS for a in args):
        return None
    multirun = any(a in _MULTIRUN_FLAGS for a in args)
    texts = [a for a in args if a not in _MULTIRUN_FLAGS]
    try:
        parsed = OverridesParser.create().parse_overrides(texts)
    except HydraException as e:
        lines = str(e).splitlines()
        raise ConfigError(unreadable_override_message(texts) or (
            f"{lines[0]}: {lines[1] if len(lines) > 1 else ''}; write each override "
            "as key=value (e.g. model=tiny train.max_steps=50)")) from None
    try:
        check_group_options(parsed)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for note in duplicate_override_notes(parsed) if warn_duplicates else ():
        warn(note)
    variants = [texts]
    if multirun:  # the fixed overrides, then each swept value on its own (Hydra's sweeper
        # would compose every job and report the first bad one its own way)
        fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
        variants = [fixed]
        for o in parsed:
            if o.value_type is not None and o.value_type.name in ("SIMPLE_CHOICE_SWEEP", "CHOICE_SWEEP",
                                                                   "RANGE_SWEEP"):
                values = list(o.sweep_string_iterator())
                if not values:  # Hydra's sweeper would launch no job, and the launcher fail on none
                    raise ConfigError(_empty_sweep_message(o))
                variants += [[*fixed, f"{o.get_key_element()}={v}"] for v in values]
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        reuse_compositions(GlobalHydra.instance().hydra.config_loader)  # a swept value: a copy, not a compose
        composed = []
        for i, overrides in enumerate(variants):
            try:
                composed.append(compose(config_name="config", overrides=overrides, return_hydra_config=True))
            except (HydraException, OmegaConfBaseException) as e:
                raise ConfigError(hydra_error_message(e, overrides)) from None
            if i == 0 and multirun:  # its size first: a sweep too large is refused before its jobs are composed
                _check_launcher(composed[0])
                _check_sweep_size(composed[0], texts)
    if not multirun:  # the run's own config, checked now: a refusal leaves no Hydra run folder behind
        run = _check_values(composed[-1])
        if run is not None and check_run is not None:
            check_run(run)
    for cfg in composed:
        _check_launcher(cfg)
    for cfg in composed if folders else ():
        try:  # last: Hydra makes this folder before the app runs (a traceback if it cannot)
            check_hydra_folder(cfg, multirun=multirun)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    return composed[0]


def _empty_sweep_message(o: Any) -> str:
    """A swept key with no value: the fix keeps the range's start (a value the user chose) and
    gives it four steps, e.g. train.max_steps=range(3,3) -> train.max_steps=range(3,7)."""
    key, v = o.get_key_element(), o.value()
    start, step = getattr(v, "start", None), getattr(v, "step", None)
    if start is None or not step:
        return f"{o.input_line} gives no value, so the sweep would have no trials; give {key} at least one value"
    stop = start + 4 * step
    fix = f"range({start:g},{stop:g}{f',{step:g}' if step != 1 else ''})"
    return f"{o.input_line} gives no value, so the sweep would have no trials; give it values, e.g. {key}={fix}"


def duplicate_override_notes(parsed: Sequence[Any]) -> list[str]:
    """One warning per key the command line sets more than once: Hydra keeps the last silently."""
    seen: dict[str, list[str]] = {}
    for o in parsed:
        seen.setdefault(o.get_key_element().lstrip("+~"), []).append(o.input_line)
    return [f"{key} is given {len(lines)} times ({', '.join(lines)}): the last, {lines[-1]}, wins; "
            "give it once" for key, lines in seen.items() if len(lines) > 1]


def _check_sweep_size(cfg: Any, texts: Sequence[str]) -> None:
    """The multirun's number of jobs, counted as Hydra's basic sweeper makes them (its params,
    then the command line's overrides; the last value list of a key wins; the product of the
    lists), against hydra.launcher.max_trials: ConfigError before any job is composed. Hydra's
    Optuna sweeper: its n_trials, n_jobs, sampler and every distribution of its space, checked by
    config.optuna_trials.optuna_proposal (what `trainlab estimate -m` lists its trials with)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    sweeper = cfg.hydra.get("sweeper") or {}
    if sweeper.get("_target_") == OPTUNA_SWEEPER:  # its settings and space, as `trainlab estimate -m` reads them
        tasks = [o.input_line for o in OverridesParser.create().parse_overrides(list(texts)) if not o.is_hydra_override()]
        optuna_proposal(sweeper, config=cfg, arguments=tasks)  # ConfigError naming the key, the value and the fix
        return
    if sweeper.get("_target_") != BASIC_SWEEPER:
        return  # another sweeper decides its own jobs
    params = OmegaConf.to_container(sweeper.get("params") or OmegaConf.create())
    counts: dict[str, int] = {}
    for o in OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()] + list(texts)):
        counts[o.get_key_element()] = len(list(o.sweep_string_iterator())) if o.is_discrete_sweep() else 1
    swept = {k: n for k, n in counts.items() if n != 1}
    try:
        check_sweep_size(math.prod(counts.values()), max_trials=cfg.hydra.launcher.get("max_trials"),
                         swept=" x ".join(f"{k} ({n} values)" for k, n in swept.items()))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _config_dirs(args: Sequence[str]) -> list[str]:
    """The folders `--config-dir DIR` / `-cd DIR` / `--config-dir=DIR` add to Hydra's search path."""
    dirs = []
    for i, a in enumerate(args):
        flag, eq, value = a.partition("=")
        if flag in ("-cd", "--config-dir"):
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            dirs += [value] if value else []
    return dirs


def _check_values(cfg: Any) -> RunConfig | None:
    """to_run_config on the composed config (without its hydra node), unless it holds an
    interpolation only Hydra's app can resolve (${hydra:...}): the app checks that one (None)."""
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    cfg = cfg.copy()  # the caller checks its hydra node next
    with open_dict(cfg):
        cfg.pop("hydra", None)
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException:
        return None
    return to_run_config(cfg)


def _check_launcher(cfg: Any) -> None:
    """hydra.launcher's own values (trainlab's launcher: hydra.launcher.prune and its knobs)."""
    from trainlab.config.prune_rule import prune_config

    launcher = cfg.hydra.get("launcher")
    if launcher is None:
        return
    try:
        check_launcher_limits(launcher)
        check_keep_warm(launcher, cluster_address=str(cfg.get("cluster", {}).get("address") or ""))
        prune_config(launcher)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def hydra_error_message(e: Exception, overrides: Sequence[str] = ()) -> str:
    """Hydra's composition error as one line: the key, the value and the fix."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    if isinstance(e, MissingConfigException) and e.missing_cfg_file and "/" in e.missing_cfg_file:
        where = re.match(r"In '([^']+)'", str(e))  # a YAML's defaults list, not the command line
        moved = where and moved_schema_message(e.missing_cfg_file, where=where.group(1))
        if moved:
            return moved
        group, _, option = e.missing_cfg_file.rpartition("/")
        options = sorted(e.options or [])  # the schemas are in no group (config.schema)
        if options:
            return (f"{group}={option} is not an option of {group}; choose one of "
                    f"{', '.join(options)} (the files in {group_folder(group)})")
        return f"{group} is not a config group; the groups are {', '.join(GROUPS)}"
    cause = e.__cause__ if e.__cause__ is not None else e
    key = getattr(cause, "full_key", None)
    first = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    if not key:
        return " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    value = _value_of(key, overrides)
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        return unknown_key_message(key, value)
    default = default_of(key)
    fix = f"; give {key} a value like its default, {key}={default}" if default is not None else ""
    return f"{key}={value}: {first}{fix}"


def group_folder(group: str) -> str:
    """Where a group's option files are, as the repository names it: conf/model/, sweeps/sweep/."""
    for d in (CONF_DIR, SWEEPS_DIR):
        if (d / group).is_dir():
            return f"{d.name}/{group}/"
    return f"{CONF_DIR.name}/{group}/"


def _value_of(key: str, overrides: Sequence[str]) -> str:
    for o in reversed(overrides):  # the last one wins, as in Hydra
        k, sep, v = o.lstrip("+~").partition("=")
        if sep and k == key:
            return v
    return "?"
