"""Hydra's composition, done once per distinct defaults list and reused for every job of a sweep.

    reuse_compositions(loader)   # a hydra ConfigLoaderImpl: its later compositions are cached

Hydra composes each job of a multirun from scratch: it reads every YAML, builds the defaults
tree and merges it (about 0.4 s per job on a 2-core machine), and a sweep is composed three
times (trainlab's override check, Hydra's sweeper validating the batch, the launcher preparing
each job). Yet jobs that differ only in values (seed=range(0,500), train.lr=...) share their
whole defaults list: only a config group choice (model=tiny, +sweep=NAME) or a hydra.* override
changes it. So a composition is keyed by those overrides, Hydra composes each key once, and
each job is a copy of it with its value overrides applied as Hydra applies them
(ConfigLoaderImpl._apply_overrides_to_config, after the defaults list, in command-line order),
with Hydra's bookkeeping of the job's overrides (hydra.overrides.task, override_dirname).
An override is a group choice by Hydra's own test (defaults_list.Overrides: its key is a group
of the config repository, and its value is no dict).
"""

from __future__ import annotations

import copy
import os
from collections import OrderedDict
from typing import Any

CACHED_COMPOSITIONS = 64
"""Distinct defaults lists kept per loader (a sweep over several group options uses a few)."""


def reuse_compositions(loader: Any) -> Any:
    """Make `loader` (Hydra's ConfigLoaderImpl) compose each distinct defaults list once; a no-op
    the second time. Returns the loader."""
    if getattr(loader, "_trainlab_compositions", None) is not None:
        return loader
    full = loader.load_configuration  # Hydra's own, bound to this loader
    cache: OrderedDict = OrderedDict()
    repos: dict = {}
    loader._trainlab_compositions = cache

    def load_configuration(config_name, overrides, run_mode, from_shell=True, validate_sweep_overrides=True):
        from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.errors import ConfigCompositionException
        from omegaconf import open_dict
        from omegaconf.errors import OmegaConfBaseException

        parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
        hydra_lines = tuple(o.input_line for o in parsed if o.is_hydra_override())
        if hydra_lines not in repos:  # the repository as this job sees it (hydra.searchpath may add groups)
            repos[hydra_lines] = loader._parse_overrides_and_create_caching_repo(config_name, list(hydra_lines))[1]
        repo = repos[hydra_lines]
        values = [o for o in parsed if _is_value_override(o, repo)]
        shaping = tuple(o.input_line for o in parsed if o not in values)
        key = (config_name, shaping, run_mode, from_shell, validate_sweep_overrides)
        if key not in cache:
            cache[key] = full(config_name, list(shaping), run_mode, from_shell, validate_sweep_overrides)
            if len(cache) > CACHED_COMPOSITIONS:
                cache.popitem(last=False)
        cache.move_to_end(key)
        cfg = copy.deepcopy(cache[key])
        if not values:
            return cfg
        try:  # as Hydra applies them: after the defaults list, struct mode on
            ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        except OmegaConfBaseException as e:
            raise ConfigCompositionException().with_traceback(e.__traceback__) from e
        app = [o for o in parsed if not o.is_hydra_override()]
        with open_dict(cfg.hydra):
            cfg.hydra.overrides.task = [o.input_line for o in app]
            cfg.hydra.runtime.cwd = os.getcwd()
            cfg.hydra.job.override_dirname = get_overrides_dirname(
                overrides=app, kv_sep=cfg.hydra.job.config.override_dirname.kv_sep,
                item_sep=cfg.hydra.job.config.override_dirname.item_sep,
                exclude_keys=cfg.hydra.job.config.override_dirname.exclude_keys)
        return cfg

    loader.load_configuration = load_configuration
    return loader


def _is_value_override(o: Any, repo: Any) -> bool:
    """A plain key=value of the config (not hydra.*, not a sweep, not a group choice): Hydra applies
    it to the composed config without changing its defaults list."""
    if o.is_hydra_override() or o.is_sweep_override() or o.package is not None:
        return False
    return isinstance(o.value(), dict) or not repo.group_exists(o.key_or_group)
