"""What a person sees in MLflow 3.17's UI: experiments in the model-training view, links that land
on a sweep's trials and on the compare page of them, params that are the knobs (paths are tags),
and a val-loss curve for a short run. Two tiny in-process trials of one sweep parent, on a real
`mlflow server`; the links as `trainlab compare` prints them, opened in headless Chromium."""

from __future__ import annotations

import re
import subprocess

import pytest
from mlflow.tracking import MlflowClient

from conftest import trainlab_cmd
from trainlab import names
from trainlab.config import compose_run_config
from trainlab.engine.run import run_trial
from trainlab.launch.lifecycle import train
from trainlab.plan.trial_plan import Where, plan_trial
from trainlab.tracking.runs import open_trial_run
from trainlab.tracking.sweep_runs import open_sweep_parent
from trainlab.tracking.trial_tracking import rank0_tracker

pytestmark = pytest.mark.slow

STEPS = 8
TINY = ["model=tiny", f"train.max_steps={STEPS}", "train.global_batch_size=4", "train.micro_batch_size=4",
        "train.seq_len=32", "train.eval_batches=1", "train.numerics_every=0", "cluster.num_workers=1",
        "cluster.device=cpu"]
KNOB = ("precision", ("fp32", "bf16"))
EXPERIMENT = "ui_experiment"


def _in_process(plan, *, name, tracking, on_event, stop):
    """launch.lifecycle.train's runner without Ray: rank 0 alone, here, logging as a worker would."""
    return run_trial(plan, tracker_factory=lambda *_: rank0_tracker(plan, tracking))


@pytest.fixture(scope="module")
def sweep(mlflow_server, tmp_path_factory):
    """An older trainlab's experiment (no kind), a sweep parent in it and its two trials."""
    root = tmp_path_factory.mktemp("ui")
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    client.create_experiment(EXPERIMENT)  # as trainlab made them before: no kind
    parent, _ = open_sweep_parent(tracking_uri=mlflow_server.uri, experiment=EXPERIMENT, sweep_name="ui_sweep",
                                  sid="ui0", definition={})
    outcomes = []
    for i, value in enumerate(KNOB[1]):
        run = compose_run_config([*TINY, f"{KNOB[0]}={value}", f"tracking.uri={mlflow_server.uri}",
                                  f"tracking.experiment={EXPERIMENT}", f"output_dir={root / f't{i}'}",
                                  # as launch.plan.plan_launch decides it for every trial
                                  f"train.checkpoint_dir={root / f't{i}' / 'checkpoints'}"])
        plan = plan_trial(run, Where(device="cpu", checkpoint_root=str(root / f"t{i}" / "checkpoints"),
                                     tracking_uri=mlflow_server.uri))
        outcome = train(plan, parent_run_id=parent, show_progress=False, runner=_in_process,
                        extra_tags={names.TAG_ROLE: names.ROLE_TRIAL, names.TAG_SWEEP: "ui_sweep",
                                    names.TAG_CONFIG_LABEL: f"{KNOB[0]}={value}"})
        assert outcome.status == names.STATUS_FINISHED, outcome.error
        outcomes.append(outcome)
    client.set_terminated(parent)
    printed = subprocess.run(trainlab_cmd("compare", "--tracking-uri", mlflow_server.uri, "--sweep", "ui_sweep"),
                             cwd=root, capture_output=True, text=True, timeout=300)
    assert printed.returncode == 0, printed.stdout + printed.stderr
    return {"client": client, "parent": parent, "outcomes": outcomes, "stdout": printed.stdout, "root": root}


def _link(stdout: str, label: str) -> str:
    found = re.findall(rf"^{label}: (http\S+)$", stdout, flags=re.M)
    assert len(found) == 1, stdout  # one link per purpose, whole on its line
    return found[0]


def test_experiments_say_model_training_and_a_users_kind_stays(sweep, mlflow_server):
    client = sweep["client"]
    exp = client.get_experiment_by_name(EXPERIMENT)  # an older trainlab's: marked when next written to
    assert exp.tags.get(names.TAG_EXPERIMENT_KIND) == names.EXPERIMENT_KIND_TRAINING, exp.tags
    run = compose_run_config([*TINY, f"tracking.uri={mlflow_server.uri}", "tracking.experiment=ui_new"])
    open_trial_run(run, tracking_uri=mlflow_server.uri, tags={})  # a new one: created marked
    assert client.get_experiment_by_name("ui_new").tags.get(names.TAG_EXPERIMENT_KIND) == "custom_model_development"
    client.create_experiment("ui_genai", tags={names.TAG_EXPERIMENT_KIND: "genai_development"})
    run = compose_run_config([*TINY, f"tracking.uri={mlflow_server.uri}", "tracking.experiment=ui_genai"])
    open_trial_run(run, tracking_uri=mlflow_server.uri, tags={})
    assert client.get_experiment_by_name("ui_genai").tags[names.TAG_EXPERIMENT_KIND] == "genai_development"


def test_params_are_the_knobs_and_paths_are_tags(sweep):
    client = sweep["client"]
    runs = [client.get_run(o.run_id) for o in sweep["outcomes"]]
    params = [r.data.params for r in runs]
    # what MLflow's compare page plots: the params whose values differ, here the knob alone
    differ = sorted(k for k in set(params[0]) | set(params[1]) if params[0].get(k) != params[1].get(k))
    assert differ == ["precision.name"], differ
    for r, i in zip(runs, range(2)):
        assert "output_dir" not in r.data.params and "train.checkpoint_dir" not in r.data.params
        assert r.data.tags[names.config_tag("output_dir")] == str(sweep["root"] / f"t{i}")
        assert r.data.tags[names.config_tag("train.checkpoint_dir")].endswith(f"t{i}/checkpoints")


def test_compare_reads_the_per_run_keys_back(sweep, mlflow_server):
    from trainlab.compare.read_sweep import load_sweep

    data = load_sweep(tracking_uri=mlflow_server.uri, sweep="ui_sweep")
    assert {t.params["output_dir"] for t in data.trials} == {str(sweep["root"] / "t0"), str(sweep["root"] / "t1")}
    assert {t.params["precision.name"] for t in data.trials} == set(KNOB[1])


def test_a_short_run_logs_a_val_curve(sweep):
    client = sweep["client"]
    steps = [m.step for m in client.get_metric_history(sweep["outcomes"][0].run_id, names.VAL_LOSS)]
    # train.eval_every left at auto: 8 steps validate every max(1, 8 // 5) = 1 step, the last included
    assert sorted(steps) == list(range(1, STEPS + 1)), steps


def test_printed_links_open_the_trials_and_their_compare_page(sweep, browser, tmp_path):
    trials, compare = _link(sweep["stdout"], "trials"), _link(sweep["stdout"], "compare")
    names_ = sorted(sweep["client"].get_run(o.run_id).info.run_name for o in sweep["outcomes"])
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(trials)
    page.get_by_text("2 matching runs").wait_for(timeout=60_000)
    for name in names_:
        page.get_by_role("link", name=name).first.wait_for(timeout=30_000)
    page.screenshot(path=str(tmp_path / "trials.png"))
    # the model-training view (runs table), not the GenAI one (traces overview)
    assert page.get_by_role("heading", name="Runs").is_visible()
    assert page.get_by_role("heading", name="Overview").count() == 0
    # the trials themselves, not their parent folded over them
    assert page.get_by_role("link", name=sweep["client"].get_run(sweep["parent"]).info.run_name).count() == 0

    page.goto(compare)
    page.get_by_text("Comparing 2 Runs").wait_for(timeout=60_000)
    page.screenshot(path=str(tmp_path / "compare.png"))
    body = page.locator("body").inner_text()
    assert all(o.run_id in body for o in sweep["outcomes"]), body[:2000]
    plotted = body.split("Parameters:")[1].split("Metrics:")[0].split()  # the params that differ
    assert plotted == ["precision.name"], plotted  # the knob, not the runs' folders
    page.close()
