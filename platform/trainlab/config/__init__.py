"""Typed configuration: schemas, composition, validation."""

from trainlab.config.convert import (
    CONF_DIR,
    ConfigError,
    compose_run_config,
    config_hash,
    flatten,
    from_dict,
    to_run_config,
    to_yaml,
)
from trainlab.config.layout_types import ParallelDims, TrialLayout
from trainlab.config.schema import GROUPS, RunConfig, register_configs
from trainlab.config.validate import ignored_options

__all__ = [
    "CONF_DIR", "ConfigError", "GROUPS", "ParallelDims", "RunConfig", "TrialLayout", "compose_run_config",
    "config_hash", "flatten", "from_dict", "ignored_options",
    "register_configs", "to_run_config", "to_yaml",
]
