"""A command line's jobs, composed and validated as `trainlab train` would run them, nothing run.

    jobs = expand_jobs(["-m", "+sweep=precision_shootout", "model=tiny"])   # [Job(overrides, run), ...]

Without -m: one job, the command line composed as `trainlab train` composes it. With -m: the
jobs Hydra's basic sweeper makes (hydra.sweeper.params of the composed config, e.g. a sweep
file's, then the command line's overrides, later keys winning; the cartesian product of every
swept key, in Hydra's order), each composed with Hydra's compose API and checked by
to_run_config. Errors are `trainlab train`'s: config.overrides.check_overrides' one line first,
then every invalid job named at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from trainlab.config.compose_cache import reuse_compositions
from trainlab.config.convert import CONF_DIR, ConfigError, to_run_config
from trainlab.config.overrides import _MULTIRUN_FLAGS, BASIC_SWEEPER, check_overrides, hydra_error_message
from trainlab.config.schema import RunConfig, register_configs


@dataclass(frozen=True)
class Job:
    overrides: tuple[str, ...]
    """The job's overrides as Hydra hands them to the launcher (the sweep's params first)."""
    run: RunConfig


def expand_jobs(args: Sequence[str], *, config_name: str = "config",
                check: Callable[[RunConfig], object] | None = None) -> list[Job]:
    """Every job of the command line `args` (as after `trainlab train`), validated; ConfigError
    naming the key, the value and the fix, or every invalid job of a sweep. `check`: what the
    caller asks of each job's RunConfig besides (the estimate command: plan.derive_layout.plan_layout),
    its ConfigError counted as the job's."""
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
        jobs = [texts]
        if multirun:
            fixed = [o.input_line for o in parser.parse_overrides(texts) if not o.is_sweep_override()]
            try:
                master = compose(config_name=config_name, overrides=fixed, return_hydra_config=True)
            except (HydraException, OmegaConfBaseException) as e:
                raise ConfigError(hydra_error_message(e, fixed)) from None
            sweeper = master.hydra.sweeper
            if sweeper.get("_target_") != BASIC_SWEEPER:
                raise ConfigError(f"hydra/sweeper={sweeper.get('_target_')}: only Hydra's basic sweeper's jobs "
                                  "can be listed before they run; drop the sweeper override")
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
    return out
