"""A Hydra multirun on Ray: validate every job, one parent run, trials concurrently, a summary.

1. compose and validate every job (run_job writes its .hydra/ folder as Hydra always does);
   one invalid job refuses the whole sweep before anything starts;
2. find or create the sweep's parent MLflow run (by a hash of its definition);
3. skip jobs whose config already finished under that parent (unless rerun);
4. run the rest as Ray trials, at most `max_concurrent_trials` at once; Ray Train's placement
   groups queue a trial until its whole gang fits; one trial's failure never stops another;
5. print and log a line per trial; exit 1 if a trial failed (divergence is a result, not a failure,
   as is a trial that hydra.launcher.prune stopped early: launch.pruner).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from hydra.core.utils import JobReturn, JobStatus, filter_overrides, run_job
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict
from rich.markup import escape

from trainlab import names
from trainlab.compare.compare_sweep import log_sweep_answer
from trainlab.config import ConfigError, RunConfig, config_hash
from trainlab.config.checkpoints import unused_checkpoint_root
from trainlab.config.prune_rule import PruneConfig, check_prunable, grace_tokens, max_tokens
from trainlab.config.sweep_limits import check_launcher_limits, check_sweep_size
from trainlab.console import CountLine, SweepProgress, console, fmt, status_text
from trainlab.events import WARNING, Notice, ProgressEvent, StepDone, TrialResult
from trainlab.launch import interrupt
from trainlab.launch.lifecycle import train
from trainlab.launch.paths import run_config_from_hydra
from trainlab.launch.plan import check_joined_gangs, plan_launch
from trainlab.launch.preflight import TrialChecks, check_sweep_services, check_sweep_trials
from trainlab.launch.pruner import Pruner, fmt_tokens
from trainlab.launch.ray_trial import connect
from trainlab.plan.trial_plan import TrialPlan
from trainlab.redact import redact, redact_files
from trainlab.tracking.mlflow_ui import sweep_link_lines
from trainlab.tracking.store import ensure_store, resolve_tracking_uri
from trainlab.tracking.sweep_runs import (
    close_sweep_parent,
    done_children,
    end_orphaned_sweep_runs,
    job_key,
    open_sweep_parent,
    sweep_id,
    unfinished_checkpoints,
)


@dataclass
class Trial:
    idx: int
    overrides: list[str]
    run: RunConfig
    job_return: JobReturn | None = None
    label: str = ""
    status: str = "pending"
    run_id: str | None = None
    plan: TrialPlan | None = None
    """As the driver resolved it before the first trial started (launch.plan)."""
    checks: TrialChecks | None = None
    """What the sweep's checks found of it (run_sweep): its plan checks none of it again; None
    where no sweep checked it (execute_sweep called directly): its plan checks it all."""
    result: TrialResult | None = None
    error: str = ""
    skipped: bool = False
    resumed: bool = False
    """Stopped before its end in an earlier run of the sweep: goes on from its checkpoints."""
    pruned_reason: str = ""
    """Status pruned: why hydra.launcher.prune stopped it."""
    submitted_at: float = 0.0
    first_step_at: float | None = None
    ended_at: float = 0.0
    extra: dict = field(default_factory=dict)
    gang: str = ""
    """Which gang ran it (tag `gang`): 'warm #3 on gang 1' or 'fresh: <why> (gang 2)'."""
    stop: interrupt.StopRequest = field(default_factory=interrupt.StopRequest)
    """stop(reason) ends this trial alone after its step, `pruned` (the sweep's pruner; its gang
    then takes the next)."""

    @property
    def start_latency_s(self) -> float | None:
        return None if self.first_step_at is None else self.first_step_at - self.submitted_at


def _key_value(override: str) -> tuple[str, str]:
    key, _, value = override.lstrip("+~").partition("=")
    return key, value


def varied_keys(job_overrides: Sequence[Sequence[str]]) -> list[str]:
    """Override keys whose value differs between jobs (or that only some jobs set): the
    dimensions of the sweep."""
    per_job = [dict(_key_value(o) for o in overrides) for overrides in job_overrides]
    keys = set().union(*per_job) if per_job else set()
    return sorted(k for k in keys if len({job.get(k) for job in per_job}) > 1)


def _pick(overrides: Sequence[str], keys: list[str], *, skip: tuple[str, ...] = ()) -> str:
    """The overrides of `keys` (minus `skip`) as 'k=v k=v', the way a person reads a trial."""
    pairs = [_key_value(o) for o in overrides]
    return " ".join(f"{k}={v}" for k, v in pairs if k in keys and k not in skip) or "default"


def _prepare(hydra_context: HydraContext, config: DictConfig, job_overrides, initial_job_idx) -> list[Trial]:
    trials, errors = [], []
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
            errors.append(f"job #{idx} ({' '.join(filter_overrides(overrides))}): {ret._return_value}")
            continue
        trials.append(Trial(idx=idx, overrides=list(filter_overrides(overrides)), run=ret.return_value,
                            job_return=ret))
    if errors:
        raise ConfigError("the sweep has invalid jobs; nothing was started:\n  " + "\n  ".join(errors))
    return trials


def _max_concurrent(trials: list[Trial], requested: int, *, gpus: bool) -> int:
    import ray

    if requested > 0:
        return requested
    res = ray.cluster_resources()
    need_cpu = max(t.run.cluster.num_workers * t.run.cluster.cpus_per_worker for t in trials)
    fits = int(res.get("CPU", 1) // need_cpu)
    if gpus and res.get("GPU", 0) > 0:
        fits = min(fits, int(res["GPU"] // max(t.run.cluster.num_workers for t in trials)))
    return max(1, fits)


def _cluster_run(trials: list[Trial]) -> RunConfig:
    """The run the sweep joins or starts its one cluster with: the largest gang's (a local
    cluster is sized for it)."""
    return max(trials, key=lambda t: t.run.cluster.num_workers * t.run.cluster.cpus_per_worker).run


def _refuse_unplaceable(todo: list[Trial], *, parent_id: str | None = None) -> list[Trial]:
    """Plan every trial before the first starts (launch.plan, once per trial: checks, resume,
    device, the GPU types it may use): those that cannot run (no GPU type of the cluster can,
    a checkpoint is damaged, ...) are reported now, with the reason, and marked failed; the
    rest go on, each with its plan."""
    placeable = []
    count = CountLine("planning trials:", len(todo))
    for t in todo:
        count.tick()
        start = time.perf_counter()
        try:  # the sweep checked its cluster and store once (check_sweep_services), and the trial
            t.plan = plan_launch(t.run, parent_run_id=parent_id, services=False, swept=t.checks)
            t.extra["plan_s"] = time.perf_counter() - start  # before its request: timed apart
            placeable.append(t)
        except ConfigError as e:
            t.status, t.error = names.STATUS_FAILED, f"refused at submission: {e}"
            console.print(f"[red]#{t.idx} {t.label}: {t.error}[/]")
    return placeable


def run_sweep(*, hydra_context: HydraContext, config: DictConfig, job_overrides, initial_job_idx: int,
              max_concurrent_trials: int = 0, rerun: bool = False,
              prune: PruneConfig | None = None, reuse_gangs: bool = True) -> list[JobReturn]:
    redact_files([Path(str(config.hydra.sweep.dir)) / "multirun.yaml"])  # Hydra's sweeper saved it
    try:  # `trainlab train` checked these already (config.overrides); another entry point may not have
        try:
            check_launcher_limits(config.hydra.launcher)
            check_sweep_size(len(job_overrides), max_trials=config.hydra.launcher.get("max_trials"))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        console.print(f"sweep of {len(job_overrides)} trials: composing, checking and planning each before the first starts")
        trials = _prepare(hydra_context, config, job_overrides, initial_job_idx)
        try:
            keys = varied_keys([t.overrides for t in trials])
            labels = [f"#{t.idx} ({_pick(t.overrides, keys)})" for t in trials]
            check_prunable(prune or PruneConfig(), [t.run for t in trials], labels)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        # every trial's data and memory, then the services: all before the parent run opens and Ray starts
        checks = check_sweep_trials([t.run for t in trials], labels)
        check_sweep_services([t.run for t in trials])
        cluster = _cluster_run(trials)
        if cluster.cluster.address:  # a joined cluster's CPUs are known once connected: joined once, here
            connect(cluster)
            check_joined_gangs([t.run for t in trials], labels)  # before any trial, its run or a Ray task
        for t, found in zip(trials, checks):
            t.checks = found
        for uri in {resolve_tracking_uri(t.run.tracking.uri) for t in trials if t.run.tracking.name == "mlflow"}:
            ensure_store(uri)  # before the parent run: a new sqlite store made once, under its lock
    except ConfigError as e:
        print(f"error: {redact(str(e))}", file=sys.stderr)
        sys.exit(2)
    # the sweep's end after a signal stays inside its handlers (launch.interrupt.interruptible)
    with interrupt.interruptible():
        outcome = execute_sweep(trials, max_concurrent_trials=max_concurrent_trials, rerun=rerun, prune=prune,
                                reuse_gangs=reuse_gangs, sweeper_params=OmegaConf.to_container(
                                    config.hydra.sweeper.get("params") or OmegaConf.create()))
        _write_timing(trials, outcome, Path(str(config.hydra.sweep.dir)))
        if outcome.interrupted:  # its trials' runs and the parent ended KILLED; nothing outlives the command
            interrupt.say_sweep_stopped(trials, signum=outcome.interrupted,
                                        labels={t.idx: _pick(t.overrides, keys) for t in trials})
            interrupt.release_cluster()
    if outcome.interrupted:
        sys.exit(128 + outcome.interrupted)
    for t in trials:
        t.job_return.return_value = t.result.final_val_loss if t.result else t.extra.get("val_loss")
    failed = [t for t in trials if t.status == names.STATUS_FAILED]
    if failed:
        console.print(f"[red]{len(failed)} of {len(trials)} trials failed[/]")
        sys.exit(1)
    return [t.job_return for t in trials]


@dataclass
class SweepOutcome:
    wall_s: float
    """Wall time of running the trials that ran (skipped ones excluded)."""
    concurrency: int
    parent_run_id: str | None
    ran: list[Trial]
    interrupted: int = 0
    """The signal (SIGINT, SIGTERM) that stopped the sweep; 0 if none did."""


def execute_sweep(trials: list[Trial], *, max_concurrent_trials: int = 0, rerun: bool = False,
                  sweeper_params: dict | None = None, prune: PruneConfig | None = None,
                  reuse_gangs: bool = True) -> SweepOutcome:
    """Everything after composition: parent run, skipping, running, reporting. No Hydra here.
    `prune`: hydra.launcher.prune's rule (checked against the trials by check_prunable).
    `reuse_gangs`: trials of the same gang shape share warm gangs (launch.gang_pool); False
    gives each trial a gang of its own."""
    keys = varied_keys([t.overrides for t in trials])
    for t in trials:
        t.label = _pick(t.overrides, keys, skip=("seed",))
    first = trials[0].run
    sweep_name = first.sweep_name or first.tracking.experiment
    parent_id, uri = None, None
    if first.tracking.name == "mlflow":
        uri = resolve_tracking_uri(first.tracking.uri)
        sid = sweep_id(sweep_name=sweep_name, experiment=first.tracking.experiment,
                       job_overrides=[t.overrides for t in trials])
        definition = json.loads(redact(json.dumps(  # an override may hold a URI's credentials
            {"sweep": sweep_name, "varied": keys, "sweeper_params": sweeper_params or {},
             "jobs": [t.overrides for t in trials]})))
        parent_id, reused = open_sweep_parent(tracking_uri=uri, experiment=first.tracking.experiment,
                                              sweep_name=sweep_name, sid=sid, definition=definition)
        done = {} if rerun else done_children(tracking_uri=uri, parent_run_id=parent_id)
        cut = {} if rerun else unfinished_checkpoints(tracking_uri=uri, parent_run_id=parent_id)
        for t in trials:
            key = job_key({names.TAG_CONFIG_HASH: config_hash(t.run), names.TAG_OVERRIDES: _pick(t.overrides, keys)})
            prior = done.get(key)
            if prior is not None:
                t.skipped, t.run_id, t.status = True, prior.info.run_id, prior.data.tags[names.TAG_STATUS]
                t.extra["val_loss"] = prior.data.metrics.get(names.VAL_LOSS)
                t.extra["tokens_per_s"] = prior.data.metrics.get(names.TOKENS_PER_S)
                t.pruned_reason = prior.data.tags.get(names.TAG_PRUNED_REASON, "")
            elif key in cut and t.run.train.resume == "auto":
                # stopped before its end: go on from its checkpoints, in the run it started
                t.run = dataclasses.replace(t.run, train=dataclasses.replace(t.run.train, checkpoint_dir=cut[key]))
                t.resumed = True
        # a driver killed with SIGKILL left runs of this sweep RUNNING: those not resumed now end FAILED
        for line in end_orphaned_sweep_runs(tracking_uri=uri, sid=sid, parent_run_id=parent_id,
                                            resumed_roots={t.run.train.checkpoint_dir for t in trials if t.resumed}):
            console.print(f"[yellow]warning:[/] {line}", soft_wrap=True)
        console.print(f"sweep [bold]{sweep_name}[/]: {len(trials)} trials over {', '.join(keys) or '-'}; "
                      f"parent run {parent_id}{' (resumed)' if reused else ''} in {redact(uri)}")

    if rerun:  # from step 1, though an earlier run of the sweep in the same folder left checkpoints

        for t in trials:
            t.run = dataclasses.replace(t.run, train=dataclasses.replace(
                t.run.train, checkpoint_dir=str(unused_checkpoint_root(t.run))))
    todo = [t for t in trials if not t.skipped]
    if len(todo) < len(trials):
        console.print(f"{len(trials) - len(todo)} trials already finished in this sweep: skipped "
                      "(hydra.launcher.rerun=true runs them again)")
    resumed = [t for t in todo if t.resumed]
    if resumed:
        console.print(f"{len(resumed)} unfinished trials resume from their checkpoints: "
                      + ", ".join(f"#{t.idx} {t.label}" for t in resumed))
    pruner = _pruner(prune, trials, todo)
    sweep_t0 = time.perf_counter()
    limit = 0
    with interrupt.interruptible() as stop:  # Ctrl-C / SIGTERM: each running trial stops after a checkpoint
        if todo:
            limit = _run_trials(todo, parent_id=parent_id, sweep_name=sweep_name, keys=keys,
                                max_concurrent=max_concurrent_trials, pruner=pruner, reuse_gangs=reuse_gangs)
    wall = time.perf_counter() - sweep_t0

    table_md = _report(trials, keys=keys, wall_s=wall, ran=todo)
    if parent_id is not None:
        # what won, on the parent's row; not when interrupted: a scheduler's grace period is for
        # the trials' checkpoints, and the rerun that resumes them logs the result
        result = None if stop.signum else log_sweep_answer(tracking_uri=uri, parent_run_id=parent_id)
        if result is not None:
            console.print(f"result: {escape(result.line)}")
        failed = any(t.status == names.STATUS_FAILED for t in trials)
        status = names.STATUS_PREEMPTED if stop.signum else names.STATUS_FAILED if failed else names.STATUS_FINISHED
        close_sweep_parent(tracking_uri=uri, parent_run_id=parent_id, summary_md=table_md, status=status)
        _print_links(uri, parent_id, [t.run_id for t in trials])
    return SweepOutcome(wall_s=wall, concurrency=limit, parent_run_id=parent_id, ran=todo,
                        interrupted=stop.signum or 0)


def _print_links(uri: str, parent_id: str, run_ids: list[str | None]) -> None:
    """Where to look at the sweep in MLflow's UI; a store that stopped answering costs no more."""
    try:
        lines = sweep_link_lines(uri, parent_run_id=parent_id, run_ids=[r for r in run_ids if r])
    except Exception as e:  # the sweep is recorded; only its links are missing
        lines = [f"(no MLflow links: {redact(str(e)).splitlines()[0][:200]})"]
    for line in lines:
        console.print(line, markup=False, soft_wrap=True)  # one line each: a terminal opens it whole


def _write_timing(trials: list[Trial], outcome: SweepOutcome, sweep_dir: Path) -> None:
    """sweep_timing.json in the multirun folder: how long trials waited, trained and took."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    rows = [{"idx": t.idx, "overrides": t.overrides, "status": t.status, "skipped": t.skipped,
             "gang": t.gang, "plan_s": t.extra.get("plan_s"), "start_latency_s": t.start_latency_s,
             "train_s": t.result.elapsed_s if t.result else None,
             "wall_s": (t.ended_at - t.submitted_at) if t.submitted_at else None} for t in trials]
    (sweep_dir / "sweep_timing.json").write_text(json.dumps(
        {"wall_s": outcome.wall_s, "concurrency": outcome.concurrency, "trials": rows}, indent=2))


def _pruner(prune: PruneConfig | None, trials: list[Trial], todo: list[Trial]):
    """hydra.launcher.prune's rule over the trials to run (None: prune=none), announced."""
    for note in prune.ignored() if prune is not None else ():
        console.print(f"[yellow]warning:[/] {note}")
    if prune is None or not prune.enabled or not todo:
        return None
    runs = [t.run for t in trials]
    pruner = Pruner(prune, grace=grace_tokens(prune, runs), longest=max(map(max_tokens, runs)),
                    labels={t.idx: f"#{t.idx} {t.label}" for t in todo})
    how = (f"rungs at {', '.join(map(fmt_tokens, pruner.rungs))} tokens, each keeping the best "
           f"1/{prune.prune_reduction_factor:g}" if prune.prune == "asha" else
           f"worse than the best trial by more than {100 * prune.prune_margin:g}% at equal tokens, "
           f"after {fmt_tokens(pruner.grace)} tokens")
    console.print(f"pruning ({prune.prune}): {how}")
    return pruner


def _run_trials(todo: list[Trial], *, parent_id, sweep_name: str, keys: list[str], max_concurrent: int,
                pruner=None, reuse_gangs: bool = True) -> int:
    connect(_cluster_run(todo))  # joined already by run_sweep where it names cluster.address
    todo = _refuse_unplaceable(todo, parent_id=parent_id)
    if not todo:
        return 0
    limit = _max_concurrent(todo, max_concurrent, gpus=any(t.plan.gang.gpus for t in todo))
    console.print(compute_line(todo))
    console.print(f"running {len(todo)} trials, at most {limit} at once")
    progress = SweepProgress(total=len(todo))
    requests = {t.idx: t.stop for t in todo}
    labels = {t.idx: f"#{t.idx} {_pick(t.overrides, keys)}" for t in todo}

    def one(t: Trial, *, runner=None, gang_tag: str = "") -> None:
        """The trial from its driver's checks to its summary line; `runner` runs it on a warm
        gang (launch.gang_pool), None on a gang of its own."""
        name = labels[t.idx]

        def on_event(event: ProgressEvent) -> None:
            if isinstance(event, StepDone):
                if t.first_step_at is None:
                    t.first_step_at = time.perf_counter()
                progress.step(name, event.step, event.max_steps)
                for idx, why in (pruner.saw(t.idx, event) if pruner is not None else {}).items():
                    requests[idx].stop(why)  # this trial, or (margin) one that ran ahead of it
                    progress.note(labels[idx], f"pruned: {why}")
            elif isinstance(event, Notice) and event.kind != WARNING:  # the trial went on from a checkpoint
                progress.note(name, event.message)

        if interrupt.current().signum:  # interrupted before its turn: left for the rerun
            t.error = "not started: the sweep was interrupted"
            return
        t.submitted_at = time.perf_counter()
        t.gang = gang_tag
        tags = {names.TAG_ROLE: names.ROLE_TRIAL, names.TAG_SWEEP: sweep_name, names.TAG_GANG: gang_tag,
                names.TAG_CONFIG_LABEL: t.label, names.TAG_OVERRIDES: _pick(t.overrides, keys)}
        # one tag per swept key, but the precision tag stays the trial's mode (vocab.precision): a
        # swept option such as bf16_pure_kahan is in config_label; compare ranks by the mode
        tags.update({k: v for k, v in map(_key_value, t.overrides)
                     if k in keys and k not in (names.TAG_SEED, names.TAG_PRECISION)})
        try:
            outcome = train(t.plan, parent_run_id=parent_id, extra_tags=tags, show_progress=False,
                            on_event=on_event, stop=requests[t.idx], runner=runner)
            t.status, t.result, t.run_id, t.error = outcome.status, outcome.result, outcome.run_id, outcome.error
            t.pruned_reason = outcome.pruned_reason
            t.extra["last_step"] = outcome.last_step  # where an interrupted trial was (interrupt.sweep_stopped_lines)
        except Exception as e:  # anything unexpected: this trial failed, the others go on
            t.status, t.error = names.STATUS_FAILED, f"{type(e).__name__}: {e}"
        if pruner is not None:
            pruner.ended(t.idx)
        t.ended_at = time.perf_counter()
        r = t.result
        progress.finished(name, f"[{progress.done + 1}/{len(todo)}] {name}: "
                                f"{_status_markup(t.status, r, t.pruned_reason)}  "
                                f"val {fmt(r and r.final_val_loss, '.4f')}  "
                                f"{fmt(r and r.tokens_per_s, ',.0f')} tok/s  "
                                f"{t.ended_at - t.submitted_at:.0f}s"
                                # as it is: gloo's "[/path/pair.cc:537]" is no rich markup
                                + (f"  {escape(redact(t.error[:200]))}" if t.error else ""))

    try:
        if reuse_gangs:
            from trainlab.launch.gang_pool import GangPool, storage_path_of

            GangPool(todo, slots=limit, run_one=one, storage_path=storage_path_of(todo)).run()
            for t in todo:
                if not t.submitted_at:  # interrupted before its turn: left for the rerun
                    t.error = "not started: the sweep was interrupted"
        else:
            with ThreadPoolExecutor(max_workers=limit, thread_name_prefix="trial") as pool:
                list(pool.map(functools.partial(one, gang_tag="fresh: reuse_gangs=false"), todo))
    finally:
        progress.close()
    return limit


def compute_line(todo: list[Trial]) -> str:
    """The sweep's estimated compute, before its first trial starts: each trial's estimated step
    time x train.max_steps x its ranks (trainlab.estimate, as planned), summed."""
    estimated = [t for t in todo if t.plan is not None and t.plan.estimate is not None]
    device_s = sum(t.plan.estimate.step_time_s * t.run.train.max_steps * len(t.plan.estimate.ranks)
                   for t in estimated)
    devices = sorted({t.plan.device for t in estimated}) or ["device"]
    amount = f"{device_s / 3600:,.2f} {'/'.join(devices)}-hours" if device_s >= 360 else \
        f"{device_s:,.0f} {'/'.join(devices)}-seconds"
    missing = f"; {len(todo) - len(estimated)} trials without an estimate" if len(estimated) < len(todo) else ""
    return (f"estimated compute: {amount} for {len(todo)} trials (step time x train.max_steps x ranks, "
            f"summed){missing}")


def _status_markup(status: str, result: TrialResult | None = None, pruned_reason: str = "") -> str:
    color = {names.STATUS_FINISHED: "green", names.STATUS_DIVERGED: "yellow",
             names.STATUS_PRUNED: "cyan"}.get(status, "red")
    return f"[{color}]{escape(status_text(status, result, pruned_reason=pruned_reason))}[/]"


def _report(trials: list[Trial], *, keys: list[str], wall_s: float, ran: list[Trial]) -> str:
    """Print the per-trial table; return it as Markdown for the parent run."""
    from rich.table import Table

    table = Table(title="sweep summary", title_justify="left")
    header = ["#", "trial", "status", "val loss", "tokens/s", "start s", "train s", "run id"]
    for h in header:
        table.add_column(h)
    rows = []
    for t in trials:
        r = t.result
        row = [str(t.idx), _pick(t.overrides, keys),
               t.status + (f" at step {r.steps}" if t.status == names.STATUS_PRUNED and r else "")
               + (" (skipped: done before)" if t.skipped else " (resumed)" if t.resumed else "")
               + (f" (rolled back {r.rollbacks}x)" if r and r.rollbacks else ""),
               fmt(r.final_val_loss if r else t.extra.get("val_loss"), ".4f"),
               fmt(r.tokens_per_s if r else t.extra.get("tokens_per_s"), ",.0f"),
               fmt(t.start_latency_s, ".1f"), fmt(r and r.elapsed_s, ".1f"), t.run_id or "-"]
        rows.append(row)
        table.add_row(*row[:2], _status_markup(t.status) + row[2][len(t.status):], *row[3:])
    console.print(table)
    for t in trials:
        if t.status == names.STATUS_PRUNED and t.pruned_reason:  # a person wants to know why
            console.print(f"#{t.idx} {escape(_pick(t.overrides, keys))} pruned: {escape(t.pruned_reason)}")
    if ran:
        console.print(f"sweep wall time {wall_s:.1f}s for {len(ran)} trials")
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(md) + "\n"
