"""`trainlab estimate` as a user runs it: the real console script in a subprocess, a single trial
and a sweep, on a cluster described in config. What it prints must be what trainlab.estimate
computes for the same composed config; bad input is refused as `trainlab train` refuses it;
nothing is started or written (no Ray session, no Hydra folder, no MLflow store).
(Reading a running Ray cluster, and placement on a mixed one: test_multinode.)"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from conftest import assert_refused, closed_port, trainlab_cmd
from trainlab.config import compose_run_config
from trainlab.estimate.trial_estimate import estimate_trial
from trainlab.plan.derive_layout import plan_layout
from trainlab.vocab.nodes import ClusterSpec


def _cmd(command: str, args: list[str], cwd: Path, env: dict) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`trainlab COMMAND ARGS` in `cwd` (a wide terminal: one table row per line), and the Ray
    sessions it left in its RAY_TMPDIR."""
    ray_tmp = cwd.parent / f"{cwd.name}-ray"
    ray_tmp.mkdir(exist_ok=True)
    proc = subprocess.run(trainlab_cmd(command, *args), cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**env, "COLUMNS": "200", "RAY_TMPDIR": str(ray_tmp)})
    return proc, [str(p) for p in ray_tmp.rglob("session_*")]


def _tokens_per_s(text: str) -> list[float]:
    return [float(m.replace(",", "")) for m in re.findall(r"tokens/s ([\d,]+)", text)]


@pytest.mark.slow  # the gate's trial estimate is test_a_trial_that_does_not_fit_is_an_answer_in_red
def test_a_trial_is_estimated_as_the_estimator_computes_it(cli_env, tmp_path):
    args = ["model=tiny", "parallel=fsdp", "precision=bf16", "cluster.num_workers=4", "train.global_batch_size=32",
            "cluster.nodes=[2xH100,2xH100]"]
    proc, sessions = _cmd("estimate", args, tmp_path, cli_env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    run = compose_run_config(args)
    est = estimate_trial(run, ClusterSpec.of_nodes(["2xH100", "2xH100"]), trial_layout=plan_layout(run))
    assert "on 2xH100 + 2xH100 (config)" in out
    assert _tokens_per_s(out) == [round(est.tokens_per_s)], out
    assert f"bound: {est.bound}" in out and "fits" in out
    assert re.search(r"^\S*\s*0-1\s.*H100 n0", out, re.M) and re.search(r"^\S*\s*2-3\s.*H100 n1", out, re.M), out
    assert not sessions and not list(tmp_path.iterdir()), "an estimate starts and writes nothing"


def test_a_trial_that_does_not_fit_is_an_answer_in_red(cli_env, tmp_path):
    proc, _ = _cmd("estimate", ["model=7b", "parallel=ddp", "cluster.nodes=[2xV100]"], tmp_path, cli_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "does NOT fit" in proc.stdout and "on its V100" in proc.stdout, proc.stdout[-3000:]


@pytest.mark.slow  # one CLI start-up per trial; the gate estimates one trial
def test_a_sweep_is_estimated_trial_by_trial_and_ranked(cli_env, tmp_path):
    args = ["-m", "+sweep=parallel_grid", "model=tiny", "cluster.nodes=[2xA100]"]
    proc, sessions = _cmd("estimate", args, tmp_path, cli_env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    layouts = ["ddp", "zero1", "zero2", "fsdp", "tp", "pp"]  # the sweep file's parallel: list
    titles = re.findall(r"^#(\d) parallel=(\w+) on 2xA100 \(config\)", out, re.M)
    assert titles == [(str(i), p) for i, p in enumerate(layouts)], out[-3000:]
    runs = {p: compose_run_config(["+sweep=parallel_grid", "model=tiny", f"parallel={p}", "cluster.nodes=[2xA100]"])
            for p in layouts}
    expected = {p: estimate_trial(run, ClusterSpec.of_nodes(["2xA100"]), trial_layout=plan_layout(run))
                for p, run in runs.items()}
    per_trial = _tokens_per_s(out)
    assert per_trial == [round(expected[p].tokens_per_s) for p in layouts], out[-3000:]
    ranked = re.findall(r"^\S\s+\d+\s+\S\s+#\d parallel=(\w+)", out.split("ranked:")[1], re.M)
    assert ranked == sorted(layouts, key=lambda p: -expected[p].tokens_per_s), out[-3000:]
    assert not sessions and not list(tmp_path.iterdir())


README_EXAMPLE = ["model=tiny", "cluster.num_workers=2", "train.global_batch_size=16", "train.micro_batch_size=3"]


def test_bad_input_is_refused_as_train_refuses_it(cli_env, tmp_path):
    estimate, sessions = _cmd("estimate", README_EXAMPLE, tmp_path, cli_env)
    assert_refused(estimate, ["train.global_batch_size=16", "multiple of 6"], sessions=sessions)
    train, _ = _cmd("train", README_EXAMPLE, tmp_path, cli_env)
    assert [e for e in estimate.stderr.splitlines() if e.startswith("error:")] == [
        e for e in train.stderr.splitlines() if e.startswith("error:")]
    small, sessions = _cmd("estimate", ["model=tiny", "cluster.num_workers=4", "train.global_batch_size=32",
                                        "cluster.nodes=[2xH100]"],
                           tmp_path, cli_env)
    assert_refused(small, ["cluster.num_workers=4", "2xH100"], sessions=sessions)
    # a running cluster to read that is not there: refused before ray.init would retry for minutes
    address = f"127.0.0.1:{closed_port()}"
    absent, sessions = _cmd("estimate", ["model=tiny", "cluster=ray", f"cluster.address={address}"], tmp_path, cli_env)
    assert_refused(absent, [f"cluster.address='{address}'", "nothing answers"], sessions=sessions)


@pytest.mark.ray
def test_the_driver_plans_a_trial_with_its_estimate(ray_cluster, tmp_path):
    """launch.plan puts the trial's estimate on the devices it was given in its plan (here: this
    machine's CPU ranks), the one the workers and the trial's records read."""
    from trainlab.launch.plan import plan_launch

    run = compose_run_config(["model=tiny", "tracking=none", f"output_dir={tmp_path}"])
    plan = plan_launch(run)
    assert plan.estimate is not None
    assert plan.estimate.ranks == estimate_trial(run, ClusterSpec.cpu(ranks=2), trial_layout=plan_layout(run)).ranks
