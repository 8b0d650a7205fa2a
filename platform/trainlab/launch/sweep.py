"""A Hydra multirun on Ray: each batch its sweeper launches becomes trials of one study.

Per batch (one launcher.launch() call):
1. compose and validate every job (run_job writes its .hydra/ folder as Hydra always does); one
   invalid job of the first batch refuses the whole sweep before anything starts; a later batch's
   invalid job (a search proposed it) is a failed trial, told to the sweeper as one;
2. at the first batch, open the study (launch.study): the sweep's parent MLflow run, found again
   by a rerun, and its gang pool;
3. skip jobs whose config already finished under that parent (unless rerun), run the rest as Ray
   trials, at most `max_concurrent_trials` at once, on the study's warm gangs; one trial's failure
   never stops another;
4. return each job's objective values (hydra.launcher.objective) to the sweeper.
The study's table, answer and parent status come once, when the multirun ends (close_open_studies,
called by trainlab.train after Hydra returns); the command exits 1 if a trial failed (divergence is
a result, not a failure, as is a trial that hydra.launcher.prune stopped early).
"""

from __future__ import annotations

import contextlib
import signal
import sys
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus, filter_overrides, run_job
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict

from trainlab import names
from trainlab.config import ConfigError, RunConfig
from trainlab.config.prune_rule import PruneConfig, check_prunable
from trainlab.config.study_rule import check_study, study_config, sweeper_info
from trainlab.config.sweep_limits import check_launcher_limits, check_sweep_size
from trainlab.console import CountLine, console
from trainlab.launch import interrupt
from trainlab.launch.objectives import returned
from trainlab.launch.paths import run_config_from_hydra
from trainlab.launch.plan import check_joined_gangs
from trainlab.launch.preflight import check_sweep_services, check_sweep_trials
from trainlab.launch.ray_trial import connect
from trainlab.launch.study import Study, SweepOutcome, close_open_studies
from trainlab.launch.sweep_folders import folder_clash
from trainlab.launch.sweep_trial import Trial, pick, search_keys, varied_keys
from trainlab.redact import redact, redact_files
from trainlab.tracking.store import ensure_store, resolve_tracking_uri

__all__ = ["Study", "SweepOutcome", "Trial", "close_open_studies", "execute_sweep", "new_study", "run_sweep"]


class TrialRefused(RuntimeError):
    """A job of a search's later batch that cannot run (its sweeper is told it failed)."""


def _prepare(hydra_context: HydraContext, config: DictConfig, job_overrides, initial_job_idx, *,
             strict: bool = True) -> tuple[list[Trial], dict[int, JobReturn]]:
    """Compose every job (Hydra's run_job: its .hydra/ folder as always). strict: an invalid job
    refuses the sweep; else it is returned apart, by its index, as the failed JobReturn it is."""
    trials, errors, refused = [], [], {}
    count = CountLine("composing and checking trials:", len(job_overrides))
    for i, overrides in enumerate(job_overrides):
        count.tick()
        idx = initial_job_idx + i
        cfg = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        with open_dict(cfg):
            cfg.hydra.job.id = idx
            cfg.hydra.job.num = idx
        ret = run_job(hydra_context=hydra_context, task_function=run_config_from_hydra, config=cfg,
                      job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
        if ret.status != JobStatus.COMPLETED:
            line = f"job #{idx} ({' '.join(filter_overrides(overrides))}): {ret._return_value}"
            if not strict:
                console.print(f"[red]{redact(line)}[/]", soft_wrap=True)
                refused[idx] = ret
            errors.append(line)
            continue
        trials.append(Trial(idx=idx, overrides=list(filter_overrides(overrides)), run=ret.return_value,
                            job_return=ret))
    if errors and strict:
        raise ConfigError("the sweep has invalid jobs; nothing was started:\n  " + "\n  ".join(errors))
    return trials, refused


def _cluster_run(trials: list[Trial]) -> RunConfig:
    """The run the sweep joins or starts its one cluster with: the largest gang's (a local
    cluster is sized for it)."""
    return max(trials, key=lambda t: t.run.cluster.num_workers * t.run.cluster.cpus_per_worker).run


def new_study(config: DictConfig, *, max_concurrent_trials: int = 0, rerun: bool = False,
              prune: PruneConfig | None = None, reuse_gangs: bool = True, keep_warm_s: float = 0) -> Study:
    """The study of a multirun (launcher.setup's config: the sweeper's node, the launcher's keys,
    the command line's overrides); ConfigError naming the key."""
    sweeper = sweeper_info(config.hydra.sweeper)
    try:
        study = study_config(config.hydra.launcher)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    params = OmegaConf.to_container(config.hydra.sweeper.get("params") or OmegaConf.create())
    keys = search_keys(list(config.hydra.overrides.task), params) if sweeper.searches else None
    return Study(sweeper=sweeper, study=study, keys=keys, prune=prune, reuse_gangs=reuse_gangs,
                 keep_warm_s=keep_warm_s, max_concurrent=max_concurrent_trials, rerun=rerun, sweeper_params=params,
                 sweep_dir=Path(str(config.hydra.sweep.dir)))


def run_sweep(*, hydra_context: HydraContext, config: DictConfig, job_overrides, initial_job_idx: int,
              study: Study) -> list[JobReturn]:
    """One batch of the multirun's jobs on its study (the launcher's); the JobReturns its sweeper reads."""
    first = not study.opened
    redact_files([Path(str(config.hydra.sweep.dir)) / "multirun.yaml"])  # Hydra's sweeper saved it
    try:  # `trainlab train` checked these already (config.overrides); another entry point may not have
        try:
            check_launcher_limits(config.hydra.launcher)
            size = study.sweeper.n_trials if study.searching and study.sweeper.n_trials else len(job_overrides)
            if first:
                check_sweep_size(size, max_trials=config.hydra.launcher.get("max_trials"))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        what = (f"batch of {len(job_overrides)} trials (#{initial_job_idx} on) of the study"
                if study.searching else f"sweep of {len(job_overrides)} trials")
        console.print(f"{what}: composing, checking and planning each before the first starts")
        # before the study's first trial a stop signal ends the checks at once (later: the study's own handling)
        with interrupt.interruptible(), interrupt.admitting() if first else contextlib.nullcontext():
            trials, refused = _prepare(hydra_context, config, job_overrides, initial_job_idx, strict=first)
            trials = _checked(trials, study, config, strict=first, refused=refused)
        for uri in {resolve_tracking_uri(t.run.tracking.uri) for t in trials if t.run.tracking.name == "mlflow"}:
            ensure_store(uri)  # before the parent run: a new sqlite store made once, under its lock
        if first and trials:
            study.claim(trials)  # one driver per study: another running it is refused before Ray starts
    except ConfigError as e:
        study.close()  # a later batch: what ran so far keeps its parent and its table
        print(f"error: {redact(str(e))}", file=sys.stderr)
        sys.exit(2)
    except interrupt.StopBeforeStart as stop:  # while the batch was checked: none of it started
        study.close()
        interrupt.say(f"interrupted by {signal.Signals(stop.signum).name} before training started")
        sys.exit(128 + stop.signum)
    if study.searching and "trainlab.launch.optuna_storage" in sys.modules:  # Hydra's Optuna sweeper, our storage
        from trainlab.launch.optuna_storage import current

        study.sweeper_storage = current()
        if study.sweeper_storage is not None:
            study.sweeper_trials |= study.sweeper_storage.batch(initial_job_idx, len(job_overrides))
    if trials:
        study.run_batch(trials)
    signum = interrupt.current().signum
    if signum:  # its trials' runs and the parent ended KILLED; nothing outlives the command
        study.close(before_release=lambda: (
            interrupt.say_sweep_stopped(study.trials, signum=signum,
                                        labels={t.idx: pick(t.overrides, study.keys) for t in study.trials}),
            interrupt.release_cluster()))
        sys.exit(128 + signum)
    for t in trials:
        if t.status == names.STATUS_FAILED and study.searching:  # the sweeper counts it (max_failure_rate)
            t.job_return.status = JobStatus.FAILED
            t.job_return._return_value = TrialRefused(f"trial #{t.idx} ({t.label}) failed: {t.error}")
        else:
            t.job_return.return_value = returned(t.objective_values)
    by_idx = {t.idx: t.job_return for t in trials} | refused
    return [by_idx[initial_job_idx + i] for i in range(len(job_overrides))]


def _checked(trials: list[Trial], study: Study, config: DictConfig, *, strict: bool,
             refused: dict[int, JobReturn]) -> list[Trial]:
    """The batch's driver checks (pruning, objectives, data, memory, the services): strict (the
    first batch) refuses the sweep on the first bad job; else a bad job is a refused JobReturn."""
    keys = study.keys if study.keys is not None else varied_keys([t.overrides for t in trials])
    labels = [f"#{t.idx} ({pick(t.overrides, keys)})" for t in trials]
    groups = [(trials, labels)] if strict else [([t], [label]) for t, label in zip(trials, labels)]
    kept, kept_labels = [], []
    for group, names_of in groups:
        try:
            try:  # one folder per job first: two in one would meet each other's lease (launch.sweep_folders)
                clash = folder_clash([*kept, *group], [*kept_labels, *names_of]) or folder_clash(
                    group, names_of, earlier=study.trials,
                    earlier_labels=[f"#{t.idx} ({pick(t.overrides, keys)})" for t in study.trials])
                if clash:
                    raise ValueError(clash)
                check_prunable(study.prune or PruneConfig(), [t.run for t in group], names_of)
                check_study(study.config, study.sweeper, [t.run for t in group], names_of)
            except ValueError as e:
                raise ConfigError(str(e)) from None
            # every trial's data and memory, then the services: all before the parent run opens and Ray starts
            checks = check_sweep_trials([t.run for t in group], names_of)
            if not study.opened:
                check_sweep_services([t.run for t in group])
                cluster = _cluster_run(group)
                if cluster.cluster.address:  # a joined cluster's CPUs are known once connected: joined once, here
                    connect(cluster)
                    check_joined_gangs([t.run for t in group], names_of)  # before any trial, its run or a Ray task
        except ConfigError as e:
            if strict:
                raise
            t = group[0]
            console.print(f"[red]{names_of[0]} refused: {redact(str(e))}[/]", soft_wrap=True)
            t.job_return.status, t.job_return._return_value = JobStatus.FAILED, TrialRefused(str(e))
            refused[t.idx] = t.job_return
            continue
        for t, found in zip(group, checks):
            t.checks = found
        kept += group
        kept_labels += names_of
    return kept


def execute_sweep(trials: list[Trial], *, max_concurrent_trials: int = 0, rerun: bool = False,
                  sweeper_params: dict | None = None, prune: PruneConfig | None = None,
                  reuse_gangs: bool = True, keep_warm_s: float = 0) -> SweepOutcome:
    """A multirun of one batch, its trials composed already (benches, tests): a study opened, run
    and closed. No Hydra here. `prune`: hydra.launcher.prune's rule (checked against the trials by
    check_prunable). `reuse_gangs`: trials of the same gang shape share warm gangs
    (launch.gang_pool); False gives each trial a gang of its own. `keep_warm_s`: gangs kept warm
    after it (launch.kept_gang), and kept ones taken first."""
    study = Study(prune=prune, reuse_gangs=reuse_gangs, keep_warm_s=keep_warm_s,
                  max_concurrent=max_concurrent_trials, rerun=rerun,
                  sweeper_params=sweeper_params)
    study.run_batch(trials)
    return study.close()
