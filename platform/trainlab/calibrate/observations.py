"""A store's finished trials as calibration Observations: each run's config rebuilt from its params,
its cluster from its hardware tags, its step time and peak memory from its metrics.

    found = read_observations(tracking_uri=uri, experiment="itest", sweep=None)
    found.observations, found.skipped   # runs that could not be read back, each with why

Measured as compare measures (compare.estimates.measured): the step time is the median of
train/step_time_s over logged steps after the first; the peak the largest rank's (the largest
sys/peak_mem_gb_max, else rank 0's sys/peak_mem_gb), as Observation and Estimate.peak_mem_gb.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from trainlab import names
from trainlab.compare import curves
from trainlab.compare.estimates import measured
from trainlab.compare.read_sweep import _experiments, _search_all, _tag_filter, read_trial
from trainlab.config import RunConfig, from_dict
from trainlab.plan.derive_layout import plan_layout
from trainlab.vocab.nodes import CPU, ClusterSpec, NodeSpec


@dataclass(frozen=True)
class Found:
    """The runs of a store made into observations, in the store's order (newest first)."""

    observations: list  # trainlab.estimate.calibration.Observation
    labels: list[str]
    """Each observation's run: its name and id, for the printed table."""
    skipped: list[str] = field(default_factory=list)
    """'<run>: why' for finished runs that could not be used."""


def _value(text: str) -> Any:
    """A param as logged (str of the value): 64, 0.001, None, True, [1, 2], ['output'] back to values;
    anything else (names, paths, 'auto') stays the string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def run_config_of(flat: dict[str, str]) -> RunConfig:
    """The RunConfig a run logged as flattened params (compare's Trial.params: the knobs and the
    per-run keys); ValueError naming the key when the schema no longer has it."""
    nested: dict[str, Any] = {}
    for key, text in flat.items():
        *path, leaf = key.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = _value(text)
    try:
        return from_dict(nested)
    except Exception as e:  # noqa: BLE001 - OmegaConf's errors name the key; a run of an older schema
        raise ValueError(str(e).splitlines()[0]) from None


def device_type(name: str) -> str:
    """A device_types entry as the estimate names devices: 'cpu (x86_64)' -> 'cpu'; a Ray
    accelerator type (H100) or a CUDA device name as it is."""
    return CPU if name.lower().startswith("cpu") else name


def cluster_of(tags: dict[str, str], params: dict[str, str]) -> ClusterSpec:
    """The devices a trial ran on (names.TAG_DEVICE_TYPES, names.TAG_NODE_COUNT) as a ClusterSpec:
    a single type spread evenly over its nodes (Ray packs a gang onto as few as it can), several
    types one node each; the links as the trial's config set them (cluster.nvlink_gb_s, ...)."""
    text = tags.get(names.TAG_DEVICE_TYPES, "")
    counts: Counter[str] = Counter()
    for item in filter(None, text.split(",")):
        name, _, n = item.rpartition(":")
        if not name or not n.isdigit():
            raise ValueError(f"tag {names.TAG_DEVICE_TYPES}={text!r} is not TYPE:COUNT,...")
        counts[device_type(name)] += int(n)
    if not counts:
        raise ValueError(f"no tag {names.TAG_DEVICE_TYPES} (a run from before it, or one that never started)")
    n_nodes = int(tags.get(names.TAG_NODE_COUNT) or 1)
    if len(counts) == 1 and n_nodes > 1:
        (kind, total), = counts.items()
        per, extra = divmod(total, n_nodes)
        nodes = tuple(NodeSpec(kind, per + (i < extra)) for i in range(n_nodes) if per + (i < extra))
    else:
        nodes = tuple(NodeSpec(kind, n) for kind, n in counts.items())
    links = {}
    for key in ("nvlink_gb_s", "network_gb_s"):
        value = _value(params.get(f"cluster.{key}", "0"))
        links[key] = float(value) if isinstance(value, (int, float)) else 0.0
    return ClusterSpec(nodes=nodes, source="store", **links)


def _finished_runs(client, *, experiment: str | None, sweep: str | None, uri: str) -> list:
    if experiment:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            there = sorted(e.name for e in _experiments(client))
            raise ValueError(f"--experiment {experiment!r}: no such experiment in {uri}; experiments there: "
                             f"{', '.join(there) or 'none'}")
        ids = [exp.experiment_id]
    else:
        ids = [e.experiment_id for e in _experiments(client)]
    query = _tag_filter(names.TAG_STATUS, names.STATUS_FINISHED)
    if sweep:
        query += " and " + _tag_filter(names.TAG_SWEEP, sweep)
    runs = _search_all(client, ids, query) if ids else []
    return [r for r in runs if r.data.tags.get(names.TAG_ROLE) != names.ROLE_SWEEP]  # trials, not parents


def read_observations(*, tracking_uri: str, experiment: str | None = None, sweep: str | None = None) -> Found:
    """Every finished trial of the store (of one experiment, of one sweep's parents) that measured a
    step time, as an Observation."""
    from mlflow.tracking import MlflowClient

    from trainlab.estimate.calibration import Observation

    client = MlflowClient(tracking_uri=tracking_uri)
    runs = _finished_runs(client, experiment=experiment, sweep=sweep, uri=tracking_uri)
    if not runs:
        where = " and ".join(filter(None, [experiment and f"experiment {experiment!r}",
                                           sweep and f"sweep {sweep!r}"])) or "any experiment"
        raise ValueError(f"no finished trial in {where} of {tracking_uri}; run trials there first "
                         "(`trainlab train ...`) or pass --tracking-uri / --experiment / --sweep for a store that has some")
    found = Found(observations=[], labels=[])
    for r in runs:
        trial = read_trial(client, r)
        who = f"{r.data.tags.get(names.TAG_CONFIG_LABEL) or r.info.run_name or '?'} ({r.info.run_id})"
        m = measured(trial)
        try:
            if m.step_time_s is None:
                raise ValueError(f"no {names.STEP_TIME_S} after its first step (train.max_steps >= 2 measures one)")
            # the largest rank's peak, as the estimate's (sys/peak_mem_gb_max where ranks reported theirs)
            peak = curves.max_finite(trial.series(names.PEAK_MEM_GB_MAX)) or m.peak_mem_gb
            run = run_config_of(dict(trial.params))
            obs = Observation(run=run, trial_layout=plan_layout(run),
                              cluster=cluster_of(r.data.tags, trial.params), step_time_s=m.step_time_s,
                              peak_mem_gb=peak)
        except ValueError as e:
            found.skipped.append(f"{who}: {e}")
            continue
        found.observations.append(obs)
        found.labels.append(who)
    return found
