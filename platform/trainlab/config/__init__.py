"""Typed configuration: schemas, composition, validation."""

from trainlab.config.load import (
    CONF_DIR,
    ConfigError,
    compose_run_config,
    config_hash,
    flatten,
    from_dict,
    to_run_config,
    to_yaml,
)
from trainlab.config.schema import GROUPS, RunConfig, register_configs
from trainlab.config.validate import ParallelDims, grad_accum_steps, ignored_options, parallel_dims

__all__ = [
    "CONF_DIR", "ConfigError", "GROUPS", "ParallelDims", "RunConfig", "compose_run_config",
    "config_hash", "flatten", "from_dict", "grad_accum_steps", "ignored_options", "parallel_dims",
    "register_configs", "to_run_config", "to_yaml",
]
