"""The Pareto front of a study of several objectives, as `trainlab compare` shows and records it.

First the pure functions on points small enough to check by hand; then a study in a real sqlite
MLflow store (parent tagged with its objectives, trial runs with the values their sweeper got),
compared as a user would, with the front in the table, the line after the answer, pareto.png, and
the tags MLflow's UI filters on. Expected fronts are worked out in comments from the logged values.
"""

from __future__ import annotations

import csv
import math
import statistics
import time

import pytest

from trainlab import names
from trainlab.compare import compare_sweep, main, pareto, plots, summarize
from trainlab.compare.compare_sweep import log_sweep_answer
from trainlab.compare.records import ConfigRow, Trial
from trainlab.vocab.objectives import OBJECTIVES

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
VAL, TPS, MEM = OBJECTIVES["val_loss"], OBJECTIVES["tokens_per_s"], OBJECTIVES["peak_mem_gb"]
DOWN, UP = VAL.better, TPS.better  # -1: lower is better; +1: higher is


# -- the pure functions ---------------------------------------------------------------------------
def test_dominance_follows_each_objectives_direction():
    assert pareto.dominates((1.0, 1.0), (2.0, 2.0), (DOWN, DOWN))
    assert not pareto.dominates((2.0, 2.0), (1.0, 1.0), (DOWN, DOWN))
    assert pareto.dominates((2.0, 2.0), (1.0, 1.0), (UP, UP))  # the same points, maximized
    # val loss down, tokens/s up: lower loss and more throughput dominates
    assert pareto.dominates((3.0, 2000.0), (3.5, 1500.0), (DOWN, UP))
    assert not pareto.dominates((3.0, 1000.0), (3.5, 1500.0), (DOWN, UP))  # a trade-off
    assert not pareto.dominates((1.0, 1.0), (1.0, 1.0), (DOWN, DOWN))  # equal: neither
    assert not pareto.dominates((None, 0.0), (5.0, 5.0), (DOWN, DOWN))  # a missing value beats nothing


def test_front_with_ties_duplicates_and_missing_values():
    # a tie on the first objective is decided by the second
    assert pareto.non_dominated([(1.0, 2.0), (1.0, 3.0)], (DOWN, DOWN)) == [True, False]
    # duplicates are both on the front; a trade-off point too
    assert pareto.non_dominated([(1.0, 2.0), (1.0, 2.0), (2.0, 1.0)], (DOWN, DOWN)) == [True, True, True]
    # one configuration is its own front, unless it misses a value
    assert pareto.non_dominated([(5.0, 5.0)], (DOWN, UP)) == [True]
    assert pareto.non_dominated([(None, 5.0)], (DOWN, UP)) == [False]
    # the one missing a value is off the front and pushes nobody off it
    assert pareto.non_dominated([(None, 1.0), (2.0, 2.0)], (DOWN, DOWN)) == [False, True]
    assert pareto.non_dominated([], (DOWN, UP)) == []


def test_front_of_three_objectives():
    # (val loss down, tokens/s up, peak GB down)
    points = [(3.0, 1000.0, 2.0),  # a: b is as good and needs less memory
              (3.0, 1000.0, 1.5),  # b: the best loss
              (3.5, 2000.0, 3.0),  # c: the fastest
              (3.6, 1900.0, 3.1),  # d: c beats it on all three
              (4.0, 500.0, 1.0)]  # e: the least memory
    assert pareto.non_dominated(points, (DOWN, UP, DOWN)) == [False, True, True, False, True]
    # on the first two alone, e (worst loss and slowest) is beaten and a ties b
    assert pareto.non_dominated([p[:2] for p in points], (DOWN, UP)) == [True, True, True, False, False]


def _row(label: str, values) -> ConfigRow:
    return ConfigRow(label=label, precision="", is_baseline=False, n_trials=1, n_finished=1, n_diverged=0,
                     n_failed=0, n_running=0, objective_values=tuple(values))


def test_front_labels_are_ordered_best_first_on_the_first_objective():
    rows = [_row("fast", (3.5, 3000.0)), _row("slow", (3.0, 1000.0)), _row("middle", (3.2, 2000.0)),
            _row("beaten", (3.6, 1500.0)), _row("twin", (3.2, 2000.0))]
    # lowest val loss first; 'middle' and 'twin' tie on both: label order
    assert pareto.front(rows, (VAL, TPS)) == ("slow", "middle", "twin", "fast")
    swapped = [_row(r.label, r.objective_values[::-1]) for r in rows]  # values in the objectives' order
    assert pareto.front(swapped, (TPS, VAL)) == ("fast", "middle", "twin", "slow")  # the fastest first
    assert pareto.front(rows, (VAL,)) == ()  # one objective: no front
    line = pareto.front_line((VAL, TPS), ("slow", "middle"))
    assert line == "Pareto front (val_loss ↓, tokens_per_s ↑): slow; middle"
    assert pareto.front_line((VAL, TPS), ()).startswith("Pareto front (val_loss ↓, tokens_per_s ↑): none")


def _trial(label: str, seed: int, status: str, **values: float) -> Trial:
    return Trial(run_id=f"{label}-{seed}", label=label, status=status, seed=str(seed),
                 metrics={names.objective_metric(k): ((0, v),) for k, v in values.items()})


def test_a_configuration_averages_its_finished_and_pruned_seeds():
    trials = [_trial("a", 0, names.STATUS_FINISHED, val_loss=3.0, tokens_per_s=1000.0),
              _trial("a", 1, names.STATUS_PRUNED, val_loss=3.4, tokens_per_s=1400.0),
              _trial("a", 2, names.STATUS_DIVERGED, val_loss=0.1, tokens_per_s=9000.0),  # not a result
              _trial("a", 3, names.STATUS_FINISHED, val_loss=math.inf, tokens_per_s=1200.0)]  # inf: left out
    assert pareto.objective_means(trials, (VAL, TPS)) == (pytest.approx(3.2), pytest.approx(1200.0))
    failed = [_trial("b", 0, names.STATUS_FAILED, val_loss=3.0)]
    assert pareto.objective_means(failed, (VAL, TPS)) == (None, None)

    s = summarize([*trials, *failed, _trial("c", 0, names.STATUS_FINISHED, val_loss=3.5, tokens_per_s=1100.0)],
                  objectives=(VAL, TPS))
    assert s.pareto_front == ("a",)  # c: worse loss, slower; b: no value
    assert [(r.label, r.pareto) for r in s.rows] == [("a", True), ("b", False), ("c", False)]
    assert s.answer.pareto_front == ("a",) and s.answer.pareto_line.endswith("): a")
    one = summarize(trials, objectives=(VAL,))  # a single objective: nothing of the front anywhere
    assert one.pareto_front == () and one.rows[0].pareto is None and one.rows[0].objective_values == ()
    assert one.answer.pareto_front is None and one.answer.pareto_line == ""


def test_plot_of_three_objectives_rings_the_front_without_a_staircase(tmp_path):
    rows = [_row("b", (3.0, 1000.0, 1.5)), _row("c", (3.5, 2000.0, 3.0)), _row("e", (4.0, 500.0, 1.0))]
    s = summarize([], objectives=(VAL, TPS, MEM))
    from dataclasses import replace

    s = replace(s, rows=tuple(replace(r, pareto=True) for r in rows), pareto_front=("b", "c", "e"))
    fig = plots.pareto_figure(s, title="three")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "tokens_per_s (higher is better)" and ax.get_ylabel() == "val_loss (lower is better)"
    assert "front over val_loss, tokens_per_s, peak_mem_gb" in ax.get_title()
    assert {t.get_text() for t in ax.texts} == {"b", "c", "e"}
    assert not [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1]  # points only: no line joins them
    path = plots.pareto_plot(s, title="three", path=tmp_path / "pareto.png")
    assert path.read_bytes()[:8] == PNG_MAGIC


# -- a study in a real MLflow store ----------------------------------------------------------------
def _metric(key, value, step):
    from mlflow.entities import Metric

    return Metric(key, float(value), int(time.time() * 1000), int(step))


# what each trial returned to its sweeper: (val loss, tokens/s); label -> one value per seed
STUDY = {
    "lr=1e-3": [(3.0, 1000.0), (3.2, 1200.0)],  # mean (3.1, 1100)
    "lr=3e-3": [(3.3, 2000.0)],
    "lr=1e-2": [(3.5, 1500.0)],  # lr=3e-3 has lower loss and more tokens/s: off the front
    "lr=3e-2": [(4.0, 3000.0)],  # the fastest
}
PRUNED = ("lr=1e-4", (2.9, 900.0))  # pruned early: its value counts, and it is the best loss
DIVERGED = "lr=1e-1"  # returned inf: no value, not on the front
FRONT = ("lr=1e-4", "lr=1e-3", "lr=3e-3", "lr=3e-2")  # by val loss: 2.9, 3.1, 3.3, 4.0


def _trial_run(client, exp, parent, label, seed, status, values):
    val, tps = values
    rid = client.create_run(exp, run_name=f"{label}-s{seed}", tags={
        names.TAG_PARENT_RUN_ID: parent, names.TAG_ROLE: names.ROLE_TRIAL, names.TAG_CONFIG_LABEL: label,
        names.TAG_OVERRIDES: f"optim.{label} seed={seed}", names.TAG_SEED: str(seed), names.TAG_PRECISION: "fp32",
        names.TAG_STATUS: status, names.TAG_CONFIG_HASH: f"hash-{label}-{seed}"}).info.run_id
    metrics = [_metric(names.objective_metric(VAL.name), val, 0), _metric(names.objective_metric(TPS.name), tps, 0)]
    for step in (1, 2, 3):  # what the trial trained: compare's other columns read these
        metrics += [_metric(names.TOKENS_PER_S, tps, step), _metric(names.TOKENS_SEEN, 1000 * step, step),
                    _metric(names.VAL_LOSS, val + 0.1 * (3 - step), step),
                    _metric(names.by_tokens(names.VAL_LOSS), val + 0.1 * (3 - step), 1000 * step)]
    client.log_batch(rid, metrics=metrics)
    return rid


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One sqlite store for the module (creating one takes seconds); each test its own study in it."""
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    return {"uri": uri, "client": MlflowClient(tracking_uri=uri), "root": root}


def _study(store, name: str, objective="val_loss,tokens_per_s"):
    """The study `name` (its experiment and sweep) in the store: STUDY, PRUNED and DIVERGED's trials."""
    client = store["client"]
    exp = client.create_experiment(name, artifact_location=(store["root"] / name).as_uri())
    parent = client.create_run(exp, run_name=f"{name}-parent", tags={
        names.TAG_ROLE: names.ROLE_SWEEP, names.TAG_SWEEP: name, names.TAG_SWEEP_ID: name,
        names.TAG_OBJECTIVE: objective, names.TAG_SWEEPER: "optuna", names.TAG_SAMPLER: "NSGAIISampler"}).info.run_id
    runs = {}
    for label, seeds in STUDY.items():
        for seed, values in enumerate(seeds):
            runs[(label, seed)] = _trial_run(client, exp, parent, label, seed, names.STATUS_FINISHED, values)
    runs[(PRUNED[0], 0)] = _trial_run(client, exp, parent, PRUNED[0], 0, names.STATUS_PRUNED, PRUNED[1])
    runs[(DIVERGED, 0)] = _trial_run(client, exp, parent, DIVERGED, 0, names.STATUS_DIVERGED, (math.inf, 5000.0))
    return {"name": name, "uri": store["uri"], "client": client, "exp": exp, "parent": parent, "runs": runs}


def _pareto_tags(study):
    client = study["client"]
    return {label: client.get_run(rid).data.tags.get(names.TAG_PARETO) for (label, _), rid in study["runs"].items()}


def test_study_front_in_the_table_plot_report_and_runs(store, tmp_path, capsys):
    study = _study(store, "two")
    out = tmp_path / "out"
    result = compare_sweep(tracking_uri=study["uri"], sweep="two", out_dir=out)
    assert result.summary.pareto_front == FRONT

    md = (out / "summary.md").read_text().splitlines()
    answer_at = md.index(f"**{result.summary.answer.line}**")
    assert md[answer_at + 2] == f"**Pareto front (val_loss ↓, tokens_per_s ↑): {'; '.join(FRONT)}**"
    header = next(line for line in md if line.startswith("| config |"))
    assert "| objective/val_loss ↓ | objective/tokens_per_s ↑ | pareto |" in header
    assert "| 3.5000 | 1,500 | no |" in next(line for line in md if line.startswith("| lr=1e-2 "))
    assert "| - | - | - |" in next(line for line in md if line.startswith(f"| {DIVERGED} |"))

    with (out / "summary.csv").open() as fh:
        rows = {r["label"]: r for r in csv.DictReader(fh)}
    assert {label for label, r in rows.items() if r["pareto"] == "true"} == set(FRONT)
    mean = {k: statistics.mean(v[i] for v in STUDY["lr=1e-3"]) for i, k in enumerate((VAL.metric, TPS.metric))}
    assert float(rows["lr=1e-3"][VAL.metric]) == pytest.approx(mean[VAL.metric])  # seeds averaged
    assert float(rows["lr=1e-3"][TPS.metric]) == pytest.approx(mean[TPS.metric])
    assert rows[DIVERGED][VAL.metric] == "" and rows[DIVERGED]["pareto"] == "false"

    png = out / plots.PARETO_PNG
    assert png in result.files and png.read_bytes()[:8] == PNG_MAGIC
    report = result.report.read_text()
    assert report.count("data:image/png;base64,") == len([p for p in result.files if p.suffix == ".png"])
    assert report.index('id="answer"') < report.index('id="pareto"') < report.index("<h1>")
    listed = {a.path for a in study["client"].list_artifacts(study["parent"], names.ARTIFACT_COMPARE_DIR)}
    assert f"{names.ARTIFACT_COMPARE_DIR}/{plots.PARETO_PNG}" in listed

    parent = study["client"].get_run(study["parent"]).data
    assert parent.tags[names.TAG_PARETO_FRONT] == "; ".join(FRONT)
    assert parent.metrics[names.PARETO_SIZE] == len(FRONT)
    assert _pareto_tags(study) == {label: str(label in FRONT).lower() for label, _ in study["runs"]}

    # the terminal: the answer's line first, as before; the front's right after it
    main(["--sweep", "two", "--tracking-uri", study["uri"], "--out", str(tmp_path / "cli"), "--no-log"])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == result.summary.answer.line
    assert printed[1] == f"Pareto front (val_loss ↓, tokens_per_s ↑): {'; '.join(FRONT)}"


def test_a_rerun_overwrites_a_front_that_changed(store):
    """The sweep's end logs the front (log_sweep_answer, as the launcher calls it); a trial that
    joins later pushes a configuration off it, and the next log says so on every run."""
    study = _study(store, "rerun")
    assert log_sweep_answer(tracking_uri=study["uri"], parent_run_id=study["parent"]) is not None
    assert _pareto_tags(study)["lr=3e-3"] == "true"
    # lr=5e-3: lower loss than lr=3e-3 (3.25 < 3.3) and faster (2100 > 2000)
    rid = _trial_run(study["client"], study["exp"], study["parent"], "lr=5e-3", 0, names.STATUS_FINISHED,
                     (3.25, 2100.0))
    result = log_sweep_answer(tracking_uri=study["uri"], parent_run_id=study["parent"])
    front = ("lr=1e-4", "lr=1e-3", "lr=5e-3", "lr=3e-2")
    assert result.pareto_front == front
    parent = study["client"].get_run(study["parent"]).data
    assert parent.tags[names.TAG_PARETO_FRONT] == "; ".join(front) and parent.metrics[names.PARETO_SIZE] == 4
    assert parent.tags[names.TAG_SWEEP_RESULT] == result.line  # the answer is logged as before
    tags = _pareto_tags(study)
    assert tags["lr=3e-3"] == "false" and tags["lr=1e-3"] == "true"
    assert study["client"].get_run(rid).data.tags[names.TAG_PARETO] == "true"


def test_a_single_objective_sweep_shows_no_front(store, tmp_path):
    study = _study(store, "one", objective="val_loss")
    out = tmp_path / "out"
    result = compare_sweep(tracking_uri=study["uri"], sweep="one", out_dir=out)
    assert not (out / plots.PARETO_PNG).exists() and out / plots.PARETO_PNG not in result.files
    md = (out / "summary.md").read_text()
    assert "Pareto" not in md and "| pareto |" not in md and "objective/" not in md
    with (out / "summary.csv").open() as fh:
        assert not {"pareto", VAL.metric} & set(csv.DictReader(fh).fieldnames)
    assert result.summary.answer.pareto_line == "" and 'id="pareto"' not in result.report.read_text()
    parent = study["client"].get_run(study["parent"]).data
    assert names.TAG_PARETO_FRONT not in parent.tags and names.PARETO_SIZE not in parent.metrics
    assert set(_pareto_tags(study).values()) == {None}
