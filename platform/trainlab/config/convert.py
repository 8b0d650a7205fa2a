"""From Hydra's composed DictConfig to a validated, typed RunConfig, and back to flat params."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trainlab.config.moved import moved_key_message
from trainlab.config.schema import AUTO_EVAL_EVERY, EVAL_AUTO, HF_ONLY_FIELDS, RunConfig, register_configs
from trainlab.config.validate import check_run
from trainlab.vocab.files import CONFIG_FILE_MAX_BYTES, check_file
from trainlab.vocab.launcher import TrainlabRayLauncherConf

REPO_ROOT = Path(__file__).resolve().parents[3]
CONF_DIR = Path(os.environ.get("TRAINLAB_CONF_DIR", REPO_ROOT / "conf"))
SWEEPS_DIR = REPO_ROOT / "sweeps"

# keys that say where results go, not what was trained: left out of the config hash
_NOT_HASHED = ("tracking", "output_dir", "sweep_name", "cluster.address", "cluster.start_timeout_s",
               "cluster.host",
               # how a trial survives faults, not what it trains
               "train.checkpoint_every", "train.checkpoint_keep", "train.checkpoint_dir", "train.resume",
               "train.export",
               "debug.inject_fault",  # a rerun without the fault resumes the faulted run's checkpoint
               "cluster.max_failures", "cluster.min_workers", "cluster.resize_interval_s",
               # the cluster an estimate is for and its calibration: what is planned, not trained
               "cluster.nodes", "cluster.nvlink_gb_s", "cluster.network_gb_s", "cluster.calibration",
               "data.cache_dir")  # where data=hf's tokens are cached, not what they are


class ConfigError(ValueError):
    """A user's config is wrong; the message names the field, the value and the fix."""


def to_run_config(cfg: DictConfig) -> RunConfig:
    """Hydra's DictConfig -> RunConfig: runs every __post_init__, then cross-field checks."""
    _check_known_keys(cfg)
    try:
        run = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        # OmegaConf wraps errors raised in __post_init__; surface the user's message alone
        cause = e.__cause__ if isinstance(e.__cause__, ValueError) else None
        msg = str(cause) if cause else _omegaconf_message(e)
        raise ConfigError(msg) from None
    except ValueError as e:
        raise ConfigError(str(e)) from None
    assert isinstance(run, RunConfig), type(run)
    try:
        check_run(run)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return run


def _check_known_keys(cfg: DictConfig, prefix: str = "") -> None:
    """Keys the schemas do not have (added with `+key=value`, which Hydra accepts and
    OmegaConf.to_object then drops without a word) are refused: nothing would read them."""
    schema = schema_at(prefix.rstrip("."))
    if schema is None:
        return
    fields = {f.name for f in dataclasses.fields(schema)}
    for key in cfg:
        name = str(key)
        if not prefix and name == "hydra":
            continue
        if name not in fields:
            value = cfg._get_node(name)._value()  # unresolved: an interpolation is shown as written
            raise ConfigError(unknown_key_message(prefix + name, value))
        child = cfg._get_node(name)
        if isinstance(child, DictConfig):
            _check_known_keys(child, prefix + name + ".")


def schema_at(dotted: str) -> type | None:
    """The dataclass of a config section by dotted path ('' = RunConfig); None if not a section."""
    if dotted == "hydra.launcher":  # trainlab's launcher (its keys: hydra.launcher.prune, ...)
        return TrainlabRayLauncherConf
    schema: Any = RunConfig
    for part in [p for p in dotted.split(".") if p]:
        f = {f.name: f for f in dataclasses.fields(schema)}.get(part)
        schema = None if f is None else f.default_factory
        if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
            return None
    return schema


def unknown_key_message(key: str, value: Any) -> str:
    """`key` is no setting: the key it moved to, or which section lacks it and the nearest key it has."""
    moved = moved_key_message(key, value)
    if moved is not None:
        return moved
    section, _, name = key.rpartition(".")
    schema = schema_at(section)
    if schema is None:
        return f"{key}={value} is not a setting; check the spelling (`trainlab train --cfg job` shows every key)"
    known = [f.name for f in dataclasses.fields(schema)]
    where = f"{section} ({schema.__name__})" if section else "the config's top level"
    close = difflib.get_close_matches(name, known, n=1)
    hint = (f"did you mean {section + '.' if section else ''}{close[0]}?" if close
            else f"remove it; the keys there are {', '.join(known)}")
    return f"{key}={value} is not a setting: {where} has no key {name!r}; {hint}"


def _omegaconf_message(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None)
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    if "missing mandatory value" in first.lower() and key:
        group = key.partition(".")[0]
        if "." in key and group_options(group):  # the group's option was removed (`~model`)
            return (f"{key} is not set: no {group} option is chosen (`~{group}` removes the default one); "
                    f"choose one with {group}=OPTION, one of {', '.join(group_options(group))}")
        return f"{key} is required but not set (???); set it on the command line: {key}=..."
    return f"{key}: {first}" if key else first


def group_options(group: str) -> list[str]:
    """The options of a config group: the YAML files in conf/<group>/ (or sweeps/<group>/)."""
    folders = [d / group for d in (CONF_DIR, SWEEPS_DIR) if (d / group).is_dir()]
    return sorted({p.stem for d in folders for p in d.glob("*.yaml")})


def check_config_files(extra: Sequence[str] = ()) -> None:
    """Every YAML of the config tree (conf/, sweeps/, and `extra` folders: --config-dir) is a
    regular file of a config's size, before Hydra reads any: a FIFO there would hang compose, a
    directory or a huge file fail inside it. Stats each name only (about 50 of them), reads
    nothing; ValueError naming it."""
    for root in (CONF_DIR, SWEEPS_DIR, *map(Path, extra)):
        for path in sorted(root.rglob("*.y*ml")) if root.is_dir() else ():
            check_file(path, field="config file", max_bytes=CONFIG_FILE_MAX_BYTES,
                       fix="replace it with a YAML file, or remove it")


def compose_run_config(overrides: Sequence[str] = (), *, config_name: str = "config") -> RunConfig:
    """Compose conf/ with Hydra's compose API (as tests and tools do) and validate."""
    from hydra import compose, initialize_config_dir

    check_config_files()
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=list(overrides))
    return to_run_config(cfg)


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """A dataclass tree as dotted keys: {'model.dim': 64, ...}. Same key set for every run."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            out.update(flatten(value, key + "."))
        else:
            out[key] = value
    return out


def hashed_config(run: RunConfig) -> dict[str, Any]:
    """The dotted fields config_hash covers: what a trial trains (a checkpoint records them)."""
    fields = {
        k: v for k, v in flatten(run).items()
        if not any(k == skip or k.startswith(skip + ".") for skip in _NOT_HASHED)
    }
    if run.data.name != "hf":
        # data=hf's fields: other corpora keep the identity they had before data=hf existed
        for name in HF_ONLY_FIELDS:
            fields.pop(f"data.{name}", None)
    if fields.get("data.split") == "":
        # empty reads what `train`, the default it replaced, read: runs keep their identity
        fields["data.split"] = "train"
    if not fields.get("model.tp_plan"):
        # the built-in plan: runs keep the identity they had before model.tp_plan existed
        fields.pop("model.tp_plan", None)
    if fields.get("train.eval_every") == EVAL_AUTO:
        # validating does not change what is trained: auto hashes as the fixed default it replaced,
        # so sweeps and checkpoints from before it keep their identity (skipped, resumed)
        fields["train.eval_every"] = AUTO_EVAL_EVERY
    return fields


def config_hash(run: RunConfig) -> str:
    """A 16-hex fingerprint of what a trial trains (not where it reports): equal configs, equal hash."""
    return hashlib.sha256(json.dumps(hashed_config(run), sort_keys=True).encode()).hexdigest()[:16]


def to_yaml(run: RunConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(run))


def from_dict(data: dict) -> RunConfig:
    """Rebuild a RunConfig from `dataclasses.asdict` output (e.g. sent to a Ray worker)."""
    merged = OmegaConf.merge(OmegaConf.structured(RunConfig), data)
    run = OmegaConf.to_object(merged)
    assert isinstance(run, RunConfig)
    return run
