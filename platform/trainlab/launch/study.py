"""One multirun as one study, however many batches its sweeper launches.

Hydra's sweepers hand the launcher one batch of jobs at a time: the basic sweeper all of a grid
at once (or max_batch_size at a time), a search sweeper (Optuna, Nevergrad, Ax) n_jobs at a time,
each batch proposed from the results of the ones before. The launcher keeps one Study for the
whole multirun, so that it has

- one parent MLflow run: opened at the first batch, found again by a rerun (sweep_id: the first
  batch's jobs and, for a search, the sweeper's identity), the trials numbered across batches as
  Hydra numbers them, the sweeper, sampler, seed and objectives on it, and its result (compare's
  answer, the table) over every trial of the study, logged once at its end;
- one gang pool (launch.gang_pool): the gangs stay warm between batches, so a later batch starts
  in the time a later trial of a grid does;
- one pruner (launch.pruner, launch.optuna_pruner) that judges every trial against all the
  study's trials, whichever batch they came in;
- skipping and resuming per batch: a job that finished under the parent before is not run again
  and returns its earlier objective values. With a seeded sampler a rerun of a killed study is
  proposed the same jobs again, so it replays what finished in no time and goes on where it stopped.

The Hydra adapter (launch.sweep.run_sweep) opens it at the launcher's first launch() and closes
it when the multirun ends (close_open_studies, called by the app after Hydra returns, and at exit).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape

from trainlab import names
from trainlab.compare.compare_sweep import log_sweep_answer
from trainlab.config import ConfigError, RunConfig, config_hash
from trainlab.config.checkpoints import unused_checkpoint_root
from trainlab.config.prune_rule import OPTUNA_PRUNERS, PruneConfig, grace_tokens, max_tokens
from trainlab.config.study_rule import StudyConfig, SweeperInfo
from trainlab.console import SweepProgress, console, fmt, warn
from trainlab.events import WARNING, Notice, ProgressEvent, StepDone
from trainlab.launch import interrupt
from trainlab.launch.lifecycle import train
from trainlab.launch.objectives import prior_values, trial_values
from trainlab.launch.plan import plan_launch
from trainlab.launch.pruner import Pruner, fmt_tokens
from trainlab.launch.ray_trial import connect
from trainlab.launch.sweep_report import compute_line, print_links, report_table, status_markup, write_timing
from trainlab.launch.sweep_trial import Trial, key_value, pick, varied_keys
from trainlab.redact import redact
from trainlab.tracking.store import resolve_tracking_uri
from trainlab.tracking.study_owner import StudyOwner, own_study
from trainlab.tracking.study_runs import log_objectives, log_study_size, tag_parent
from trainlab.tracking.sweep_runs import (
    check_sweep_free,
    close_sweep_parent,
    done_children,
    end_orphaned_sweep_runs,
    job_key,
    open_sweep_parent,
    sweep_id,
    unfinished_checkpoints,
)


@dataclass
class SweepOutcome:
    wall_s: float
    """Wall time from the first trial's start to the last one's end (skipped ones excluded)."""
    concurrency: int
    parent_run_id: str | None
    ran: list[Trial]
    interrupted: int = 0
    """The signal (SIGINT, SIGTERM) that stopped the sweep; 0 if none did."""
    gang_starts: int = 0
    """Gangs started for the study's trials (warm gangs and gangs of their own)."""
    failed: int = 0
    """Trials of the study that failed (the command then exits 1)."""
    trials: int = 0
    """Trials of the study, skipped ones included."""


class Study:
    """One multirun's parent run, gang pool, pruner and report (see the module docstring)."""

    def __init__(self, *, sweeper: SweeperInfo | None = None, study: StudyConfig | None = None,
                 keys: list[str] | None = None, prune: PruneConfig | None = None, reuse_gangs: bool = True,
                 keep_warm_s: float = 0, max_concurrent: int = 0, rerun: bool = False, sweeper_params: dict | None = None,
                 sweep_dir: Path | None = None) -> None:
        """`keys`: the swept keys trials are labelled by (a search's space: launch.sweep_trial.
        search_keys); None: the keys whose values differ within the first batch (a grid's)."""
        self.sweeper, self.config = sweeper, study or StudyConfig()
        self.keys = keys
        self.prune, self.reuse_gangs, self.max_concurrent, self.rerun = prune, reuse_gangs, max_concurrent, rerun
        self.keep_warm_s = keep_warm_s
        self.sweeper_params, self.sweep_dir = sweeper_params or {}, sweep_dir
        self.trials: list[Trial] = []
        self.ran: list[Trial] = []
        self.parent_id: str | None = None
        self.uri: str | None = None
        self.sweep_name = ""
        self.limit = 0
        self.opened = self.closed = False
        self._pool = None
        self._pruner = None
        self._first_run: RunConfig | None = None
        self._started: float | None = None
        self._ended = 0.0
        self._signals = contextlib.ExitStack()
        self._owner: StudyOwner | None = None
        """This driver's hold on the study (tracking.study_owner), from the parent's opening to close."""
        self.sweeper_storage = None
        """Hydra's Optuna sweeper's study storage where it is trainlab's (launch.optuna_storage)."""
        self.sweeper_trials: dict[int, int] = {}
        """Job index -> its trial id in that storage."""

    @property
    def searching(self) -> bool:
        return self.sweeper is not None and self.sweeper.searches

    # -- a batch -------------------------------------------------------------------------
    def run_batch(self, batch: list[Trial]) -> None:
        """Run one batch of the sweeper's jobs (each trial's status, result and objective values
        set when this returns; an interrupt leaves the rest pending)."""
        if not self.opened:
            self._open(batch)
        for t in batch:
            t.label = pick(t.overrides, self.keys, skip=("seed",))
        self._match_earlier(batch)
        self.trials += batch
        todo = [t for t in batch if not t.skipped]
        if self.rerun:  # from step 1, though an earlier run of the sweep in the same folder left checkpoints
            for t in todo:
                t.run = dataclasses.replace(t.run, train=dataclasses.replace(
                    t.run.train, checkpoint_dir=str(unused_checkpoint_root(t.run))))
        if len(todo) < len(batch):
            console.print(f"{len(batch) - len(todo)} trials already finished in this sweep: skipped "
                          "(hydra.launcher.rerun=true runs them again)")
        resumed = [t for t in todo if t.resumed]
        if resumed:
            console.print(f"{len(resumed)} unfinished trials resume from their checkpoints: "
                          + ", ".join(f"#{t.idx} {t.label}" for t in resumed))
        for t in batch:
            if t.skipped and t.status == names.STATUS_PRUNED:
                self._tell_pruned(t)
        if todo and not interrupt.current().signum:
            self._run(todo)
        for t in todo:  # a skipped trial returns the values its earlier run recorded (_match_earlier)
            values = trial_values(t, self.config)
            if values is None:
                continue
            t.objective_values = tuple(values[n] for n in self.config.objective)
            if t.run_id and self.uri:
                with contextlib.suppress(Exception):  # a value the store did not take is still returned
                    log_objectives(tracking_uri=self.uri, run_id=t.run_id, values=values)

    def claim(self, batch: list[Trial]) -> None:
        """Make this driver the study's one owner (tracking.study_owner), or StudyHeld (a ConfigError)
        naming the driver that runs it: called with the first batch, before its parent run opens or
        Ray starts. Idempotent; a study tracked nowhere (tracking=none) shares nothing to own."""
        if self._owner is not None or self.uri is not None:
            return
        if self.keys is None:
            self.keys = varied_keys([t.overrides for t in batch])
        first = batch[0].run
        self.sweep_name = first.sweep_name or first.tracking.experiment
        if first.tracking.name != "mlflow":
            return
        uri = resolve_tracking_uri(first.tracking.uri)
        self._sid = sweep_id(sweep_name=self.sweep_name, experiment=first.tracking.experiment,
                             job_overrides=[t.overrides for t in batch], study=self._identity())
        self._owner = own_study(tracking_uri=uri, sid=self._sid, sweep_name=self.sweep_name)
        try:  # a driver on another host shares no lock file with this one: its parent run says it runs
            check_sweep_free(tracking_uri=uri, experiment=first.tracking.experiment, sid=self._sid,
                             sweep_name=self.sweep_name)
        except BaseException:
            self._owner.release()
            self._owner = None
            raise
        self.uri = uri

    def _identity(self) -> dict | None:
        """A search's identity in its sweep id: its sweeper and objectives (None for a grid)."""
        return {**self.sweeper.identity(), "objective": list(self.config.objective)} if self.searching else None

    def _open(self, batch: list[Trial]) -> None:
        """The parent run and what the study keeps for all its batches (signals handled from here on)."""
        self.opened = True
        self._signals.enter_context(interrupt.interruptible())
        atexit.register(self._close_at_exit)  # an entry point that never calls close_open_studies
        _OPEN.append(self)
        first = self._first_run = batch[0].run
        self.claim(batch)
        if self.searching and self.sweeper.seed is None:
            warn(f"hydra/sweeper={self.sweeper.name} has no seed: a rerun of this study is proposed other trials, "
                 "so it starts a new study instead of continuing this one; set hydra.sweeper.sampler.seed=0 to "
                 "make it resumable")
        if self.uri is None:
            return
        identity = self._identity()
        definition = json.loads(redact(json.dumps(  # an override may hold a URI's credentials
            {"sweep": self.sweep_name, "varied": self.keys, "sweeper_params": self.sweeper_params,
             "jobs": [t.overrides for t in batch], **({"sweeper": identity} if identity else {})})))
        self.parent_id, reused = open_sweep_parent(tracking_uri=self.uri, experiment=first.tracking.experiment,
                                                   sweep_name=self.sweep_name, sid=self._sid, definition=definition)
        tags = {names.TAG_OBJECTIVE: ",".join(self.config.objective)}
        if self.sweeper is not None:
            tags.update(self.sweeper.tags())
        tag_parent(tracking_uri=self.uri, parent_run_id=self.parent_id, tags=tags)
        self._owner.beat(tracking_uri=self.uri, run_id=self.parent_id)
        # a driver killed with SIGKILL left runs of this sweep RUNNING: those it may resume stay so
        cut = {} if self.rerun else unfinished_checkpoints(tracking_uri=self.uri, parent_run_id=self.parent_id)
        self._end_orphans(resumable=set(cut.values()))
        what = (f"a study by hydra/sweeper={self.sweeper.name} ({self.sweeper.sampler}"
                + (f", seed {self.sweeper.seed}" if self.sweeper.seed is not None else "")
                + (f", {self.sweeper.n_trials} trials, {self.sweeper.batch_size} at a time" if self.sweeper.n_trials else "")
                + f") over {', '.join(self.keys) or '-'}, returning {', '.join(self.config.objective)}"
                if self.searching else f"{len(batch)} trials over {', '.join(self.keys) or '-'}")
        console.print(f"sweep [bold]{self.sweep_name}[/]: {what}; parent run {self.parent_id}"
                      f"{' (resumed)' if reused else ''} in {redact(self.uri)}", soft_wrap=True)

    def _end_orphans(self, *, resumable: set[str]) -> None:
        for line in end_orphaned_sweep_runs(tracking_uri=self.uri, sid=self._sid, parent_run_id=self.parent_id,
                                            resumed_roots=resumable):
            warn(line)

    def _match_earlier(self, batch: list[Trial]) -> None:
        """Skip the jobs done under the parent before (their earlier objective values are what they
        return); resume those stopped with a checkpoint. Asked per batch: a search replays its jobs."""
        if self.parent_id is None or self.rerun:
            return
        done = done_children(tracking_uri=self.uri, parent_run_id=self.parent_id)
        cut = unfinished_checkpoints(tracking_uri=self.uri, parent_run_id=self.parent_id)
        for t in batch:
            key = job_key({names.TAG_CONFIG_HASH: config_hash(t.run), names.TAG_OVERRIDES: pick(t.overrides, self.keys)})
            prior = done.get(key)
            if prior is not None:
                t.skipped, t.run_id, t.status = True, prior.info.run_id, prior.data.tags[names.TAG_STATUS]
                t.extra["val_loss"] = prior.data.metrics.get(names.VAL_LOSS)
                t.extra["tokens_per_s"] = prior.data.metrics.get(names.TOKENS_PER_S)
                t.pruned_reason = prior.data.tags.get(names.TAG_PRUNED_REASON, "")
                t.objective_values = tuple(prior_values(prior.data.metrics, self.config).values())
            elif key in cut and t.run.train.resume == "auto":
                # stopped before its end: go on from its checkpoints, in the run it started
                t.run = dataclasses.replace(t.run, train=dataclasses.replace(t.run.train, checkpoint_dir=cut[key]))
                t.resumed = True

    def _run(self, todo: list[Trial]) -> None:
        connect(self._first_run)  # joined already by run_sweep where it names cluster.address
        todo = self._placeable(todo)
        if not todo:
            return
        limit = _max_concurrent(todo, self.max_concurrent, gpus=any(t.plan.gang.gpus for t in todo))
        self.limit = max(self.limit, limit)
        console.print(compute_line(todo))
        batch = f" (batch of the study: trials {len(self.trials)} so far)" if self.searching else ""
        console.print(f"running {len(todo)} trials, at most {limit} at once{batch}")
        self._add_to_pruner(todo)
        if self._started is None:
            self._started = time.perf_counter()
        progress = SweepProgress(total=len(todo))
        one = functools.partial(self._one, progress=progress, total=len(todo))
        try:
            if self.reuse_gangs:
                if self._pool is None:
                    from trainlab.launch.gang_pool import GangPool, storage_path_of

                    self._pool = GangPool(storage_path=storage_path_of(todo), keep_warm_s=self.keep_warm_s,
                                          expected_trials=(self.sweeper.n_trials or 0) if self.sweeper else 0)
                self._pool.submit(todo, slots=limit, run_one=one)  # this batch's progress line
                self._pool.wait(todo)
                for t in todo:
                    if not t.submitted_at:  # interrupted before its turn: left for the rerun
                        t.error = "not started: the sweep was interrupted"
            else:
                with ThreadPoolExecutor(max_workers=limit, thread_name_prefix="trial") as pool:
                    list(pool.map(functools.partial(one, gang_tag="fresh: reuse_gangs=false"), todo))
        finally:
            progress.close()
            self._ended = time.perf_counter()
        self.ran += todo

    def _placeable(self, todo: list[Trial]) -> list[Trial]:
        """Plan every trial before the first starts (launch.plan, once per trial: checks, resume,
        device, the GPU types it may use): those that cannot run (no GPU type of the cluster can,
        a checkpoint is damaged, ...) are reported now, with the reason, and marked failed; the
        rest go on, each with its plan."""
        from trainlab.console import CountLine

        placeable = []
        count = CountLine("planning trials:", len(todo))
        for t in todo:
            count.tick()
            start = time.perf_counter()
            try:  # the sweep checked its cluster and store once (check_sweep_services), and the trial
                t.plan = plan_launch(t.run, parent_run_id=self.parent_id, services=False, swept=t.checks)
                t.extra["plan_s"] = time.perf_counter() - start  # before its request: timed apart
                placeable.append(t)
            except ConfigError as e:
                t.status, t.error = names.STATUS_FAILED, f"refused at submission: {e}"
                console.print(f"[red]#{t.idx} {t.label}: {t.error}[/]")
        return placeable

    def _add_to_pruner(self, todo: list[Trial]) -> None:
        labels = {t.idx: f"#{t.idx} {t.label}" for t in todo}
        if self._pruner is not None:
            self._pruner.add(labels)
            return
        prune = self.prune
        for note in prune.ignored() if prune is not None else ():
            warn(note)
        if prune is None or not prune.enabled:
            return
        runs = [t.run for t in todo]
        grace, longest = grace_tokens(prune, runs), max(map(max_tokens, runs))
        if prune.prune in OPTUNA_PRUNERS:
            from trainlab.launch.optuna_pruner import PRUNER_CLASSES, OptunaPruner

            unit = min(r.train.eval_interval * r.train.global_batch_size * r.train.seq_len for r in runs)
            self._pruner = OptunaPruner(prune, grace=grace, longest=longest, unit=unit, labels=labels)
            how = (f"Optuna's {PRUNER_CLASSES[prune.prune]} on val loss at equal tokens (every "
                   f"{fmt_tokens(unit)} tokens), after {fmt_tokens(grace)} tokens"
                   + (f" and {prune.prune_startup_trials} ended trials" if prune.prune == "median" else ""))
        else:
            self._pruner = Pruner(prune, grace=grace, longest=longest, labels=labels)
            how = (f"rungs at {', '.join(map(fmt_tokens, self._pruner.rungs))} tokens, each keeping the best "
                   f"1/{prune.prune_reduction_factor:g}" if prune.prune == "asha" else
                   f"worse than the best trial by more than {100 * prune.prune_margin:g}% at equal tokens, "
                   f"after {fmt_tokens(self._pruner.grace)} tokens")
        console.print(f"pruning ({prune.prune}): {how}")

    def _one(self, t: Trial, *, progress: SweepProgress, total: int, runner=None, gang_tag: str = "") -> None:
        """The trial from its driver's checks to its summary line; `runner` runs it on a warm
        gang (launch.gang_pool), None on a gang of its own."""
        name = f"#{t.idx} {pick(t.overrides, self.keys)}"
        pruner = self._pruner
        by_idx = {x.idx: x for x in self.trials}

        def on_event(event: ProgressEvent) -> None:
            if isinstance(event, StepDone):
                if t.first_step_at is None:
                    t.first_step_at = time.perf_counter()
                if event.val_loss is not None and event.tokens is not None:
                    t.curve.append((event.tokens, event.val_loss))
                    if t.idx in self.sweeper_trials:  # the sweeper's study sees the curve, as trial.report
                        self.sweeper_storage.report(self.sweeper_trials[t.idx], tokens=event.tokens,
                                                    val_loss=event.val_loss)
                progress.step(name, event.step, event.max_steps)
                for idx, why in (pruner.saw(t.idx, event) if pruner is not None else {}).items():
                    by_idx[idx].stop.stop(why)  # this trial, or (margin) one that ran ahead of it
                    progress.note(f"#{idx} {pick(by_idx[idx].overrides, self.keys)}", f"pruned: {why}")
            elif isinstance(event, Notice) and event.kind != WARNING:  # the trial went on from a checkpoint
                progress.note(name, event.message)

        if interrupt.current().signum:  # interrupted before its turn: left for the rerun
            t.error = "not started: the sweep was interrupted"
            return
        t.submitted_at = time.perf_counter()
        t.gang = gang_tag
        tags = {names.TAG_ROLE: names.ROLE_TRIAL, names.TAG_SWEEP: self.sweep_name, names.TAG_GANG: gang_tag,
                names.TAG_CONFIG_LABEL: t.label, names.TAG_OVERRIDES: pick(t.overrides, self.keys)}
        # one tag per swept key, but the precision tag stays the trial's mode (vocab.precision): a
        # swept option such as bf16_pure_kahan is in config_label; compare ranks by the mode
        tags.update({k: v for k, v in map(key_value, t.overrides)
                     if k in self.keys and k not in (names.TAG_SEED, names.TAG_PRECISION)})
        try:
            outcome = train(t.plan, parent_run_id=self.parent_id, extra_tags=tags, show_progress=False,
                            on_event=on_event, stop=t.stop, runner=runner)
            t.status, t.result, t.run_id, t.error = outcome.status, outcome.result, outcome.run_id, outcome.error
            t.pruned_reason = outcome.pruned_reason
            t.extra["last_step"] = outcome.last_step  # where an interrupted trial was (interrupt.sweep_stopped_lines)
        except Exception as e:  # anything unexpected: this trial failed, the others go on
            t.status, t.error = names.STATUS_FAILED, f"{type(e).__name__}: {e}"
        if pruner is not None:
            pruner.ended(t.idx, status=t.status, value=t.result.final_val_loss if t.result else None)
        if t.status == names.STATUS_PRUNED:
            self._tell_pruned(t)
        t.ended_at = time.perf_counter()
        r = t.result
        progress.finished(name, f"[{progress.done + 1}/{total}] {name}: "
                                f"{status_markup(t.status, r, t.pruned_reason)}  "
                                f"val {fmt(r and r.final_val_loss, '.4f')}  "
                                f"{fmt(r and r.tokens_per_s, ',.0f')} tok/s  "
                                f"{t.ended_at - t.submitted_at:.0f}s"
                                # as it is: gloo's "[/path/pair.cc:537]" is no rich markup
                                + (f"  {escape(redact(t.error[:200]))}" if t.error else ""))

    def _tell_pruned(self, t: Trial) -> None:
        """The sweeper's study records the trial as PRUNED (where its storage is trainlab's)."""
        if t.idx in self.sweeper_trials:
            self.sweeper_storage.mark_pruned(self.sweeper_trials[t.idx])

    # -- the end -------------------------------------------------------------------------
    def close(self, *, before_release=None) -> SweepOutcome:
        """The gangs end; the table over every trial of the study, its answer and the parent's
        status. Idempotent (the app's call, then atexit's). `before_release`: what an interrupted
        multirun does last while its signal handlers still hold (its lines, release_cluster)."""
        signum = interrupt.current().signum or 0
        outcome = SweepOutcome(wall_s=(self._ended - self._started) if self._started else 0.0,
                               concurrency=self.limit, parent_run_id=self.parent_id, ran=self.ran,
                               interrupted=signum, gang_starts=sum(not t.gang.startswith("warm") for t in self.ran
                                                                   if t.gang),
                               failed=sum(t.status == names.STATUS_FAILED for t in self.trials),
                               trials=len(self.trials))
        if self.closed or not self.opened:
            return outcome
        self.closed = True
        with contextlib.suppress(ValueError):
            _OPEN.remove(self)
        try:
            if self._pool is not None:
                self._pool.close()
            table_md = report_table(self.trials, keys=self.keys, wall_s=outcome.wall_s, ran=self.ran)
            if self.sweep_dir is not None:
                write_timing(self.trials, wall_s=outcome.wall_s, concurrency=outcome.concurrency,
                             sweep_dir=self.sweep_dir)
                if self.sweeper_storage is not None:  # the sweeper's study, beside its optimization_results.yaml
                    self.sweeper_storage.write(self.sweep_dir / "optuna_trials.json")
            if self.parent_id is not None:
                self._close_parent(table_md, signum=signum)
            if before_release is not None:
                before_release()
        finally:
            if self._owner is not None:
                self._owner.release()
            self._signals.close()
        return outcome

    def _close_at_exit(self) -> None:
        if not self.closed:
            with contextlib.suppress(Exception):  # Ray may be gone by now: the parent's end is what matters
                self.close()

    def _close_parent(self, table_md: str, *, signum: int) -> None:
        with contextlib.suppress(Exception):
            log_study_size(tracking_uri=self.uri, parent_run_id=self.parent_id, trials=len(self.trials))
        # what won, on the parent's row; not when interrupted: a scheduler's grace period is for
        # the trials' checkpoints, and the rerun that resumes them logs the result
        result = None if signum else log_sweep_answer(tracking_uri=self.uri, parent_run_id=self.parent_id)
        if result is not None:
            console.print(f"result: {escape(result.line)}")
            if result.pareto_line:  # several objectives: what no configuration beats on all of them
                console.print(escape(result.pareto_line), soft_wrap=True)
        failed = any(t.status == names.STATUS_FAILED for t in self.trials)
        status = names.STATUS_PREEMPTED if signum else names.STATUS_FAILED if failed else names.STATUS_FINISHED
        close_sweep_parent(tracking_uri=self.uri, parent_run_id=self.parent_id, summary_md=table_md, status=status)
        if self.searching and not signum:  # runs a killed driver left that no batch of this study resumed
            self._end_orphans(resumable=set())
        print_links(self.uri, self.parent_id, [t.run_id for t in self.trials])


_OPEN: list[Study] = []
"""The studies opened in this process and not yet closed (the launcher's; one per multirun)."""


def close_open_studies() -> list[SweepOutcome]:
    """Close every study still open: the multirun ended (Hydra returned, or raised)."""
    return [s.close() for s in list(_OPEN)]


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
