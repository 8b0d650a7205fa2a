"""Every path a user gives, made absolute once, on the driver, before anything reads it.

Ray workers (and the MLflow writer they start) run in directories of Ray's choosing, so a
relative `data.path=tok.bin` or `train.resume=outputs/.../checkpoints` read there names
nothing. The driver resolves each path field of the config against the directory the command
was started in (and `~` against the user's home) and hands the workers the absolute form:

    data.path, train.resume (a path), train.checkpoint_dir, output_dir, tracking.uri
    (data=hf: data.path, data.tokenizer and data.cache_dir; model=hf: model.config, model.pretrained;
    a Hub name is kept as typed)

The tracking URI is resolved by trainlab.tracking.store (forms MLflow would misread are
refused, a server's credentials moved out of it). Resolving an absolute config again changes
nothing, so every entry point may call this: the Hydra app (a trial, each job of a sweep, a
submitted job's driver, each torchrun rank) and launch.lifecycle.train for library callers.

On a cluster trainlab joins (cluster.address), workers may run on other machines, which must
see these absolute paths too (shared storage mounted at the same place). The driver cannot
check another node's file system before the gang starts; `shared_storage_notes` says which
fields must be visible there, as Ray Train asks of its storage_path on multi-node clusters.
"""

from __future__ import annotations

import dataclasses
import os

from omegaconf import DictConfig

from trainlab.config import ConfigError, RunConfig, to_run_config
from trainlab.config.checkpoints import checkpoint_root
from trainlab.plan.derive_layout import plan_layout
from trainlab.redact import redact_files
from trainlab.tracking.store import (
    tracking_field,
    tracking_store,
    use_tracking_store,
)
from trainlab.vocab.hub import looks_like_hub_name

RESUME_KEYWORDS = ("auto", "never")


def absolute(path: str, *, cwd: str | None = None) -> str:
    """`path` with `~` expanded, joined to `cwd` (default: this process's) if relative, and
    normalised. Symlinks are kept: a shared mount seen through a link is the same path on every node."""
    if not path:
        return path
    return os.path.normpath(os.path.join(cwd or os.getcwd(), os.path.expanduser(path)))


def local_or_hub(path: str, *, cwd: str | None = None) -> str:
    """absolute(path), except a Hub name (owner/name) that names nothing here: kept as typed, for
    the preflight to refuse it as one (launch.preflight, vocab.hub)."""
    resolved = absolute(path, cwd=cwd)
    return path if looks_like_hub_name(path) and not os.path.lexists(resolved) else resolved


def resolve_paths(run: RunConfig, *, cwd: str | None = None) -> RunConfig:
    """`run` with every path field absolute and tracking.uri in the form every process uses.

    With tracking=mlflow the store is chosen here (tracking.uri, $MLFLOW_TRACKING_URI or
    MLflow's default) and a server's user name and password are handed to MLflow's client in
    this process. ConfigError (naming the setting, the value with credentials masked, and the
    fix) for a tracking URI MLflow would misread."""
    t, d = run.train, run.data
    train = dataclasses.replace(
        t, checkpoint_dir=absolute(t.checkpoint_dir, cwd=cwd),
        resume=t.resume if t.resume in RESUME_KEYWORDS else absolute(t.resume, cwd=cwd))
    data = dataclasses.replace(d, path=absolute(d.path, cwd=cwd)) if d.name == "tokens" else d
    if d.name == "hf":
        data = dataclasses.replace(d, path=local_or_hub(d.path, cwd=cwd), tokenizer=local_or_hub(d.tokenizer, cwd=cwd),
                                   cache_dir=absolute(d.cache_dir, cwd=cwd))
    model = run.model
    if model.name == "hf":  # workers run elsewhere (Ray's own working dir): the folders as this shell sees them
        model = dataclasses.replace(model, config=local_or_hub(model.config, cwd=cwd),
                                    pretrained=local_or_hub(model.pretrained, cwd=cwd))
    tracking = run.tracking
    if tracking.name == "mlflow":
        try:
            store = use_tracking_store(tracking.uri, cwd=cwd)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if tracking.uri:  # empty stays empty: "$MLFLOW_TRACKING_URI or MLflow's default", as recorded
            tracking = dataclasses.replace(tracking, uri=store.uri)
    return dataclasses.replace(run, model=model, train=train, data=data, tracking=tracking,
                               output_dir=absolute(run.output_dir, cwd=cwd))


def shared_storage_notes(run: RunConfig) -> list[str]:
    """On a cluster joined at cluster.address: one warning per path the workers open, that every
    node must see it at that absolute path. Empty for the local cluster."""
    if not run.cluster.address:
        return []
    paths = []
    if run.data.name == "tokens":
        paths.append(("data.path", run.data.path, "every worker reads the corpus"))
    if run.data.name == "hf":  # a node without the driver's cached tokens tokenizes them once itself
        paths += [("data.path", run.data.path, "a node without the tokens cached reads the dataset"),
                  ("data.tokenizer", run.data.tokenizer, "every worker reads the tokenizer")]
    for field in ("config", "pretrained"):
        if getattr(run.model, field):
            paths.append((f"model.{field}", getattr(run.model, field), "every worker reads the model's files"))
    if run.train.resume not in RESUME_KEYWORDS:
        paths.append(("train.resume", run.train.resume, "every worker reads the checkpoint"))
    paths.append(("train.checkpoint_dir" if run.train.checkpoint_dir else "output_dir",
                  str(checkpoint_root(run)), "every worker writes and reads checkpoints"))
    if run.tracking.name == "mlflow":  # rank 0's writer writes a local store (MLflow's default too)
        store = tracking_store(run.tracking.uri)
        if store.local_path is not None:
            paths.append((tracking_field(run.tracking.uri), store.uri,
                          "rank 0 writes the MLflow store (an mlflow server needs no shared storage)"))
    where = f"cluster.address={run.cluster.address!r}"
    return [f"{where}: {what} at {field}={path!r}; trainlab cannot check other nodes from "
            "here, so every node must see that absolute path (shared storage mounted at the same place)"
            for field, path, what in paths]


def run_config_from_hydra(cfg: DictConfig) -> RunConfig:
    """The job's typed config with every path absolute (resolve_paths): the driver's one resolution."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized() and HydraConfig.get().output_subdir:  # Hydra saved the overrides there
        redact_files([os.path.join(HydraConfig.get().runtime.output_dir, HydraConfig.get().output_subdir)])
    run = to_run_config(cfg)
    if not run.output_dir:
        run.output_dir = HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else os.getcwd()
    run = resolve_paths(run)
    plan_layout(run)  # a layout that cannot run is refused here, like every bad config, before anything starts
    return run
