"""Read a sweep from MLflow: find its parent run by one selector, then its trials and metrics.

The only module of compare that talks to MLflow for reading; it returns plain records.
"""

from __future__ import annotations

import math
import sys
from datetime import datetime, timezone

from trainlab import names
from trainlab.compare.records import Series, SweepData, Trial
from trainlab.tracking.runs import config_of
from trainlab.tracking.store import TrackingStore
from trainlab.tracking.sweep_runs import job_key
from trainlab.vocab.objectives import OBJECTIVES, Objective

# the histories compare uses; other metrics stay in MLflow
METRICS = (
    names.VAL_LOSS, names.TOKENS_PER_S, names.MFU, names.PEAK_MEM_GB, names.GRAD_NORM,
    names.LOSS_SCALE, names.SKIPPED_STEPS, names.NONFINITE_STEPS, names.LOSS_SPIKES,
    names.TOKENS_SEEN, names.LOSS, names.PARAM_NORM, names.by_tokens(names.LOSS), names.by_tokens(names.VAL_LOSS),
    names.STEP_TIME_S, names.PEAK_MEM_GB_MAX, *names.EST_METRICS,  # estimate vs measured (compare.estimates)
    *(names.cast_max_metric(kind, stat) for kind in names.CAST_TENSORS
      for stat in (names.CAST_UNDERFLOW, names.CAST_OVERFLOW)),
)  # and every `objective/<name>` a trial logged (_loaded)
_PAGE = 1000


def _tag_filter(key: str, value: str) -> str:
    # backticks: tag keys with dots (trainlab.role, mlflow.parentRunId) must be quoted
    return f"tags.`{key}` = '{value}'"


def _search_all(client, experiment_ids: list[str], filter_string: str) -> list:
    """Every matching run, newest first (search_runs is paged)."""
    runs, token = [], None
    while True:
        page = client.search_runs(experiment_ids, filter_string=filter_string, max_results=_PAGE,
                                  order_by=["attributes.start_time DESC"], page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _experiments(client) -> list:
    exps, token = [], None
    while True:
        page = client.search_experiments(max_results=_PAGE, page_token=token)
        exps.extend(page)
        token = page.token
        if not token:
            return exps


def _all_parents(client) -> list:
    ids = [e.experiment_id for e in _experiments(client)]
    return _search_all(client, ids, _tag_filter(names.TAG_ROLE, names.ROLE_SWEEP)) if ids else []


def _sweep_name(run, experiment_name: str) -> str:
    return run.data.tags.get(names.TAG_SWEEP) or experiment_name


def _parents_for_sweep(client, sweep: str, uri: str) -> list:
    exp = client.get_experiment_by_name(sweep)
    if exp is not None:
        parents = _search_all(client, [exp.experiment_id], _tag_filter(names.TAG_ROLE, names.ROLE_SWEEP))
        # an experiment may hold several sweeps: prefer parents that name this one
        named = [p for p in parents if p.data.tags.get(names.TAG_SWEEP) == sweep]
        if named or parents:
            return named or parents
    all_parents = _all_parents(client)
    parents = [p for p in all_parents if p.data.tags.get(names.TAG_SWEEP) == sweep]
    if not parents:
        names_there = sorted({p.data.tags.get(names.TAG_SWEEP, "") for p in all_parents} - {""})
        raise ValueError(f"no sweep named {sweep!r} in {uri}; sweeps there: "
                         f"{', '.join(names_there) or 'none'}")
    return parents


def _parents_for_experiment(client, experiment: str, uri: str) -> list:
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        there = sorted(e.name for e in _experiments(client))
        raise ValueError(f"no experiment named {experiment!r} in {uri}; experiments there: "
                         f"{', '.join(there) or 'none'}")
    parents = _search_all(client, [exp.experiment_id], _tag_filter(names.TAG_ROLE, names.ROLE_SWEEP))
    if not parents:
        raise ValueError(f"experiment {experiment!r} has no sweep parent run (tag "
                         f"{names.TAG_ROLE}={names.ROLE_SWEEP}); run a sweep into it first, "
                         f"or pass --parent RUN_ID")
    return parents


def _parent_by_id(client, run_id: str, uri: str):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as e:
        raise ValueError(f"no run with id {run_id!r} in {uri} ({e.error_code}); "
                         f"pass the parent run's id as shown in the MLflow UI") from None


def _value(v: float) -> float:
    # SQL stores cannot hold inf: MLflow writes +/-inf as +/-max float; undo it, so an overflowed
    # grad norm counts as non-finite and not as the largest grad norm ever seen
    return math.copysign(math.inf, v) if abs(v) == sys.float_info.max else float(v)


def _series(client, run_id: str, key: str) -> Series:
    by_step: dict[int, tuple[int, float]] = {}
    for m in client.get_metric_history(run_id, key):
        # a step logged twice (a resumed run): the later write wins
        if m.step not in by_step or m.timestamp >= by_step[m.step][0]:
            by_step[m.step] = (m.timestamp, _value(m.value))
    return tuple((step, by_step[step][1]) for step in sorted(by_step))


def _status(run) -> str:
    tag = run.data.tags.get(names.TAG_STATUS)
    if tag:
        return tag
    # a run closed without the tag (killed driver): MLflow's own status is the best we have
    return {"FINISHED": names.STATUS_FINISHED, "FAILED": names.STATUS_FAILED,
            "KILLED": names.STATUS_FAILED}.get(run.info.status, names.STATUS_RUNNING)


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text not in (None, "") else None
    except ValueError:
        return None


def _loaded(logged: set[str]) -> list[str]:
    """Which of a run's metrics compare reads: METRICS, and what it returned to a sweeper (one
    `objective/<name>` per objective, the Pareto front's values), whichever objectives they are."""
    return [*(k for k in METRICS if k in logged), *sorted(k for k in logged if k.startswith(names.OBJECTIVE_PREFIX))]


def objectives_of(parent) -> tuple[tuple[Objective, ...], str]:
    """The objectives the parent's names.TAG_OBJECTIVE names, in order, and a note for the user
    naming any this trainlab does not know (left out: their direction is unknown), else ""."""
    listed = [n.strip() for n in parent.data.tags.get(names.TAG_OBJECTIVE, "").split(",") if n.strip()]
    unknown = [n for n in listed if n not in OBJECTIVES]
    note = (f"objective(s) {', '.join(unknown)} of the parent's tag {names.TAG_OBJECTIVE} are unknown to this "
            f"trainlab (it knows {', '.join(OBJECTIVES)}): left out of the Pareto front") if unknown else ""
    return tuple(OBJECTIVES[n] for n in listed if n in OBJECTIVES), note


def read_trial(client, run) -> Trial:
    """A child run as a Trial, with the histories of METRICS it logged."""
    tags = run.data.tags
    precision = tags.get(names.TAG_PRECISION, "")
    # the label is what seeds are aggregated over; older runs without it fall back to precision
    label = tags.get(names.TAG_CONFIG_LABEL) or (precision and f"{names.TAG_PRECISION}={precision}") \
        or run.info.run_name or run.info.run_id
    logged = set(run.data.metrics)
    return Trial(
        run_id=run.info.run_id, label=label, status=_status(run), seed=tags.get(names.TAG_SEED, ""),
        precision=precision, run_name=run.info.run_name or "",
        diverged_step=_int_or_none(tags.get(names.TAG_DIVERGED_STEP)), error=tags.get(names.TAG_ERROR, ""),
        pruned_step=_int_or_none(tags.get(names.TAG_PRUNED_STEP)), pruned_reason=tags.get(names.TAG_PRUNED_REASON, ""),
        attempt_key=job_key(tags) if {names.TAG_CONFIG_HASH, names.TAG_OVERRIDES} & set(tags) else run.info.run_id,
        device_types=tags.get(names.TAG_DEVICE_TYPES, ""),
        world_size=_int_or_none(tags.get(names.TAG_WORLD_SIZE)) or 0,
        metrics={k: _series(client, run.info.run_id, k) for k in _loaded(logged)},
        params=config_of(dict(run.data.params), tags), params_sha=tags.get(names.TAG_PARAMS_SHA, ""),
        loss_curve_sha=tags.get(names.TAG_LOSS_CURVE_SHA, ""),
        est_bound=tags.get(names.TAG_EST_BOUND, ""), est_calibration=tags.get(names.TAG_EST_CALIBRATION, ""),
    )


def latest_attempts(trials_newest_first: list[Trial]) -> tuple[list[Trial], int]:
    """One trial per job (attempt_key), the newest; and how many older attempts were dropped.

    A rerun of a sweep retries its failed jobs as new children of the same parent: counting the
    failed attempt as well would report a failure that the retry fixed.
    """
    seen: set[str] = set()
    kept = []
    for t in trials_newest_first:
        if t.attempt_key not in seen:
            seen.add(t.attempt_key)
            kept.append(t)
    return kept, len(trials_newest_first) - len(kept)


def _check_store(uri: str) -> None:
    path = TrackingStore.of(uri).local_path
    # opening a sqlite URI that does not exist would create an empty store: refuse instead
    if path is not None and not path.exists():
        raise ValueError(f"no MLflow store at {path} (tracking URI {uri}); pass --tracking-uri "
                         f"or set MLFLOW_TRACKING_URI to the store the sweep logged to")


def load_sweep(*, tracking_uri: str, sweep: str | None = None, experiment: str | None = None,
               parent_run_id: str | None = None) -> SweepData:
    """Find a sweep's parent run by exactly one selector and read all of its trials.

    sweep: the experiment of that name, else parent runs tagged names.TAG_SWEEP == sweep;
    experiment: the parent runs in that experiment; parent_run_id: that run. When several
    parent runs match, the most recent is taken and SweepData.note says so.
    """
    from mlflow.tracking import MlflowClient

    given = {k: v for k, v in (("sweep", sweep), ("experiment", experiment),
                               ("parent_run_id", parent_run_id)) if v}
    if len(given) != 1:
        raise ValueError(f"give exactly one of sweep, experiment, parent_run_id (got "
                         f"{', '.join(given) or 'none'})")
    _check_store(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    if sweep:
        parents = _parents_for_sweep(client, sweep, tracking_uri)
        what = f"sweep {sweep!r}"
    elif experiment:
        parents = _parents_for_experiment(client, experiment, tracking_uri)
        what = f"experiment {experiment!r}"
    else:
        parents = [_parent_by_id(client, parent_run_id, tracking_uri)]
        what = f"parent run {parent_run_id!r}"
    parent = parents[0]  # newest first
    note = ""
    if len(parents) > 1:
        started = datetime.fromtimestamp(parent.info.start_time / 1000, tz=timezone.utc)
        note = (f"{len(parents)} parent runs match {what}; using the most recent, "
                f"{parent.info.run_id} started {started:%Y-%m-%d %H:%M:%S} UTC (--parent picks another)")
    exp = client.get_experiment(parent.info.experiment_id)
    children = _search_all(client, [exp.experiment_id],
                           _tag_filter(names.TAG_PARENT_RUN_ID, parent.info.run_id))
    if not children:
        raise ValueError(f"{what}: parent run {parent.info.run_id} has no trial runs (children "
                         f"tagged {names.TAG_PARENT_RUN_ID}); has the sweep started?")
    trials, superseded = latest_attempts([read_trial(client, c) for c in children])
    if superseded:
        note = "; ".join(filter(None, [note, f"{superseded} earlier attempt(s) of rerun jobs left out "
                                             f"(only each job's latest run counts)"]))
    objectives, unknown = objectives_of(parent)
    return SweepData(name=_sweep_name(parent, exp.name), experiment_name=exp.name,
                     experiment_id=exp.experiment_id, parent_run_id=parent.info.run_id,
                     tracking_uri=tracking_uri, trials=tuple(reversed(trials)),  # oldest first
                     n_parents=len(parents), note="; ".join(filter(None, [note, unknown])), objectives=objectives)
