"""A multi-node Ray cluster on this machine's loopback, started the way users start one: a head
node declaring (logical) H100s and a second node declaring V100s, each by `ray start` with its
own temp dir. A sweep goes in through the Ray Jobs API (`trainlab submit`); each trial must land
on the GPU type its precision allows, be tagged with where it ran, and reach MLflow.

Workers compute on CPU (debug.logical_gpus): the GPUs are Ray resources, which is all that
placement sees.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO, assert_refused, free_port, trainlab_cmd
from doc_commands import CLUSTERS, exports, find, section_commands, substitute, without_redirect

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RAY = str(Path(sys.executable).parent / "ray")


PAGE, SECTION = CLUSTERS
"""The docs section whose commands this module runs: the fixture starts its cluster with the
page's `ray start` lines and the tests run its `ray job`/`trainlab` lines (doc_commands)."""


def _ray_start(env: dict, command: list[str], *args: str) -> None:
    proc = subprocess.run(
        # --node-ip-address: on loopback, else Ray picks the machine's routable address
        [RAY, *command[1:], "--node-ip-address", "127.0.0.1", "--num-cpus", "2",
         "--dashboard-agent-listen-port", str(free_port()), "--disable-usage-stats", *args],
        env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(command)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def loopback_cluster(tmp_path_factory):
    """Head (2 x H100) + node (2 x V100) on 127.0.0.1, started by the clusters page's own commands (its
    `export`s, `ray get-auth-token --generate`, the two `ray start`s), with token auth as Ray 2.60
    heads use it. HOME is a folder of the test's: the token and the jobs' default output root
    (~/trainlab-outputs) are the test's own."""
    commands = section_commands(SECTION, page=PAGE)
    home = tmp_path_factory.mktemp("home")
    # a user's shell: no RAY_* left by this pytest process's own cluster (its single-node switch
    # would make the second `ray start` refuse to join)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))}
    env |= exports(commands) | {"HOME": str(home)}
    # short paths: Ray's Unix sockets live under the temp dir
    dirs = [tempfile.mkdtemp(prefix="tlh", dir="/tmp"), tempfile.mkdtemp(prefix="tln", dir="/tmp")]
    gcs, dashboard = free_port(), free_port()
    swap = {"6391": str(gcs), "8265": str(dashboard), "/tmp/rh": dirs[0], "/tmp/rn": dirs[1]}
    token = subprocess.run([RAY, *without_redirect(find(commands, "ray", "get-auth-token"))[1:]],
                           env=env, capture_output=True, text=True, timeout=120)
    assert token.returncode == 0 and (home / ".ray" / "auth_token").is_file(), token.stderr[-2000:]
    try:
        _ray_start(env, substitute(find(commands, "ray", "start", "--head"), swap),
                   "--ray-client-server-port", str(free_port()))
        _ray_start(env, substitute(find(commands, "ray", "start", "--address"), swap))
        yield SimpleNamespace(env=env, jobs_url=f"http://127.0.0.1:{dashboard}", gcs=f"127.0.0.1:{gcs}",
                              home=home, token=(home / ".ray" / "auth_token").read_text().strip(),
                              commands=commands, temp_dirs=dirs)
    finally:
        for d in dirs:  # only this cluster's processes: `ray stop` would stop every cluster here
            subprocess.run(["pkill", "-KILL", "-f", d], check=False)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def test_a_sweep_submitted_through_ray_jobs_lands_by_precision(loopback_cluster, tmp_path, mlflow_db):
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = loopback_cluster.env | {"MLFLOW_TRACKING_URI": uri, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        trainlab_cmd("submit", "--address", loopback_cluster.jobs_url, "-m", "--",
                     "precision=fp16,fp8_tensorwise", "debug.logical_gpus=true",
                     # one worker a trial: where a trial lands is the claim here (two workers of a
                     # trial packed on one node, or spread: the pack-and-spread test)
                     "model=tiny", "train.max_steps=3", "train.eval_every=0", "cluster.num_workers=1"),
        env=env, cwd=REPO, capture_output=True, text=True, timeout=540)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "submitted job raysubmit_" in out and "SUCCEEDED" in out

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("trainlab").experiment_id],
                              filter_string="tags.`trainlab.role` = 'trial'")
    landed = {r.data.tags["precision"]: (r.data.tags["device_types"], r.data.tags["node_count"],
                                         r.data.tags["status"]) for r in runs}
    # FP8 needs SM 8.9: only the H100 node (BF16's 8.0 is refused on the V100 below); FP16 runs
    # anywhere and is routed to the least capable type (same_type placement), keeping the H100s free
    assert landed == {"fp16": ("V100:1", "1", "finished"),
                      "fp8_tensorwise": ("H100:1", "1", "finished")}


def test_a_trial_no_node_can_run_is_refused_at_submission(loopback_cluster, tmp_path):
    proc = subprocess.run(
        trainlab_cmd("train", "cluster=ray", f"cluster.address={loopback_cluster.gcs}",
                     "debug.logical_gpus=true", "precision=bf16", "cluster.accelerator_type=V100",
                     "model=tiny", "tracking=none", f"hydra.run.dir={tmp_path}"),
        env=loopback_cluster.env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr
    assert "no GPU type of the cluster can run this trial" in err
    assert "V100: " in err and "H100: cluster.accelerator_type=V100" in err
    assert "Traceback" not in err


ESTIMATED = ["cluster=ray", "debug.logical_gpus=true", "precision=fp16", "cluster.num_workers=2", "tracking=none"]
"""A trial on the running cluster's GPUs (logical: the estimate reads the types Ray declares)."""


def test_estimate_reads_the_running_cluster_and_places_by_memory(loopback_cluster, tmp_path):
    """tiny fits every type and goes to the least capable (same_type); 7B fully sharded over 2
    ranks fits an H100's memory, not a V100's, and is placed on the H100s, as the estimate says."""
    proc = subprocess.run(
        trainlab_cmd("estimate", "-m", *ESTIMATED, f"cluster.address={loopback_cluster.gcs}", "model=tiny,7b",
                     "parallel=fsdp"),
        env=loopback_cluster.env | {"COLUMNS": "200"}, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "#0 model=tiny on 2xV100 (ray)" in out and "placed on V100 (not H100)" in out, out[-3000:]
    assert "#1 model=7b on 2xH100 (ray)" in out and "placed on H100 (not V100)" in out, out[-3000:]


def test_a_trial_its_estimate_fits_on_no_type_is_refused_with_the_numbers(loopback_cluster, tmp_path):
    proc = subprocess.run(
        trainlab_cmd("train", *ESTIMATED, f"cluster.address={loopback_cluster.gcs}", "model=7b", "parallel=ddp",
                     f"hydra.run.dir={tmp_path}"),
        env=loopback_cluster.env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    err = proc.stderr
    assert proc.returncode == 2, proc.stdout[-3000:] + err[-3000:]
    assert "no GPU type of the cluster can run this trial" in err
    for kind in ("V100", "H100"):
        assert re.search(rf"{kind}: by its estimate, rank \d needs [\d.]+ GB .* but its {kind} holds", err), err
    assert "fix: parallel=fsdp" in err and "Traceback" not in err


# ---- the clusters page's Ray commands, run as printed (placeholders swapped for this cluster's) ------

FAST = ["debug.logical_gpus=true", "model=tiny", "train.max_steps=3", "train.eval_every=0", "cluster.num_workers=1"]
"""Appended to the page's trainings: the same commands, a trial of seconds."""
STATE_QUERY = """
import json, sys
from ray.job_submission import JobSubmissionClient
from ray.util.state import list_tasks
url, sid = sys.argv[1], sys.argv[2]
job = JobSubmissionClient(url).get_job_info(sid).job_id
tasks = list_tasks(address=url, filters=[("job_id", "=", job)], limit=10_000, raise_on_missing_output=False)
print(json.dumps([[t.name, t.state, t.error_type or ""] for t in tasks]))
"""


def _readme(cluster, *words: str, **more: str) -> list[str]:
    """The clusters page's command starting with `words`, on this cluster, runnable (ray/trainlab of this venv)."""
    cmd = substitute(find(cluster.commands, *words), {"http://HEAD:8265": cluster.jobs_url,
                                                      "HEAD:6379": cluster.gcs, **more})
    return [RAY, *cmd[1:]] if cmd[0] == "ray" else trainlab_cmd(*cmd[1:])


def _run(cluster, cmd: list[str], *, env: dict | None = None, timeout: float = 540) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env or cluster.env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _job_id(out: str) -> str:
    import re

    m = re.search(r"\b(raysubmit_\w+)", out)
    assert m, out[-3000:]
    return m.group(1)


def test_readme_ray_job_submit_works_as_printed(loopback_cluster, tmp_path, mlflow_db):
    """`ray job submit` (Ray's CLI: the token is sent only in token mode, which the page
    exports) runs the page's sweep; its parent run in MLflow says it was that job."""
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [*_readme(loopback_cluster, "ray", "job", "submit", **{"http://MLFLOW:5000": uri}), *FAST]
    proc = _run(loopback_cluster, cmd)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "succeeded" in out.lower(), out[-4000:]
    sid = _job_id(out)

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("trainlab").experiment_id])
    parents = [r for r in runs if r.data.tags.get("trainlab.role") == "sweep"]
    trials = [r for r in runs if r.data.tags.get("trainlab.role") == "trial"]
    assert {r.data.tags["precision"]: r.data.tags["status"] for r in trials} == {"fp16": "finished",
                                                                                "bf16": "finished"}
    assert len(parents) == 1 and parents[0].info.run_name.endswith(f"(job {sid})"), parents[0].info.run_name
    assert {r.data.tags.get("ray_job") for r in runs} == {sid}

    listed = _run(loopback_cluster, _readme(loopback_cluster, "ray", "job", "list"), timeout=120)
    assert listed.returncode == 0 and sid in listed.stdout + listed.stderr, listed.stderr[-2000:]


def test_a_submitted_trial_keeps_its_outputs_names_its_run_and_fails_no_ray_task(loopback_cluster, tmp_path, mlflow_db):
    """The page's `trainlab submit` of one trial: Ray's state API shows no FAILED task of the
    job (progress polls used to fail, 85 of 167), its outputs outlive Ray's working dir under
    ~/trainlab-outputs/<job id>, its MLflow run is named for the job; `trainlab status` and
    `trainlab logs` as printed answer for it."""
    import json

    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = loopback_cluster.env | {"MLFLOW_TRACKING_URI": uri}
    proc = _run(loopback_cluster, [*_readme(loopback_cluster, "trainlab", "submit", "--address",
                                            "http://HEAD:8265", "--"), *FAST], env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "SUCCEEDED" in out, out[-4000:]
    sid = _job_id(out)

    state = subprocess.run([sys.executable, "-c", STATE_QUERY, loopback_cluster.jobs_url, sid],
                           env=env, capture_output=True, text=True, timeout=120)
    assert state.returncode == 0, state.stderr[-3000:]
    tasks = json.loads(state.stdout.strip().splitlines()[-1])
    failed = [t for t in tasks if t[1] == "FAILED"]
    assert tasks and not failed, f"{len(failed)} of {len(tasks)} tasks FAILED: {failed[:10]}"

    folder = loopback_cluster.home / "trainlab-outputs" / sid
    assert (folder / ".hydra" / "config.yaml").is_file() and (folder / "checkpoints").is_dir(), out[-3000:]

    client = mlflow.MlflowClient(uri)
    (trial,) = client.search_runs([client.get_experiment_by_name("trainlab").experiment_id])
    assert trial.info.run_name == f"tiny-bf16-ddp1-s0 (job {sid})" and trial.data.tags["ray_job"] == sid

    status = _run(loopback_cluster, _readme(loopback_cluster, "trainlab", "status", raysubmit_XYZ=sid), env=env)
    assert status.returncode == 0 and f"job {sid}: SUCCEEDED" in status.stdout, status.stderr[-2000:]
    logs = _run(loopback_cluster, _readme(loopback_cluster, "trainlab", "logs", raysubmit_XYZ=sid), env=env)
    assert logs.returncode == 0 and "tiny-bf16-ddp1-s0" in logs.stdout and f"job {sid}: SUCCEEDED" in logs.stdout


def test_trainlab_stop_as_printed_stops_a_job(loopback_cluster, tmp_path, mlflow_db):
    import time

    submit = _readme(loopback_cluster, "trainlab", "submit", "--address", "http://HEAD:8265", "--")
    cut = submit.index("--")
    env = loopback_cluster.env | {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    proc = _run(loopback_cluster, [*submit[:cut], "--no-wait", *submit[cut:], *FAST], env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sid = _job_id(proc.stdout)
    stop = _run(loopback_cluster, _readme(loopback_cluster, "trainlab", "stop", raysubmit_XYZ=sid), timeout=120)
    assert stop.returncode == 0 and f"job {sid}: stop requested" in stop.stdout, stop.stdout + stop.stderr
    status_cmd = _readme(loopback_cluster, "trainlab", "status", raysubmit_XYZ=sid)
    deadline = time.monotonic() + 240  # a job stops in seconds; each status command is a Python start
    while "STOPPED" not in (status := _run(loopback_cluster, status_cmd, timeout=120)).stdout:
        assert time.monotonic() < deadline, status.stdout + status.stderr
        time.sleep(2)


@pytest.mark.parametrize("job_id", ["raysubmit_XYZ", "", "#"])
def test_an_unknown_job_id_is_one_error_line(loopback_cluster, job_id):
    """The page's own placeholder id names no job; nor do ids that are no URL path segment
    (Ray's client fetched the job list for those and raised a TypeError)."""
    for command in ("status", "logs", "stop"):
        proc = _run(loopback_cluster, _readme(loopback_cluster, "trainlab", command, raysubmit_XYZ=job_id),
                    timeout=120)
        assert_refused(proc, [f"no job {job_id!r}", "ray job list --address"], sessions=[], context=command)


def test_the_dashboard_opens_with_the_token(loopback_cluster, browser, tmp_path):
    """The dashboard asks for the token (the page: paste what `ray get-auth-token` prints), and
    with it the browser may read the cluster's jobs."""
    printed = subprocess.run([RAY, "get-auth-token"], env=loopback_cluster.env, capture_output=True,
                             text=True, timeout=120)
    assert printed.returncode == 0 and printed.stdout.strip() == loopback_cluster.token
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(loopback_cluster.jobs_url + "/#/jobs")
    page.get_by_text("Authentication Token Required").wait_for(timeout=60_000)
    assert page.request.get(loopback_cluster.jobs_url + "/api/jobs/").status == 401
    page.screenshot(path=str(tmp_path / "dashboard_prompt.png"))
    page.get_by_placeholder("Enter your authentication token").fill(printed.stdout.strip())
    page.get_by_role("button", name="Submit").click()
    page.get_by_text("Authentication Token Required").wait_for(state="detached", timeout=60_000)
    assert page.request.get(loopback_cluster.jobs_url + "/api/jobs/").status == 200
    page.wait_for_timeout(3000)
    page.screenshot(path=str(tmp_path / "dashboard_jobs.png"))


def test_pack_and_spread_land_so_and_a_refused_trial_stops_no_other_without_exported_token_mode(
        loopback_cluster, tmp_path, mlflow_db):
    """A sweep that joins the cluster from a shell with the token on disk but no RAY_AUTH_MODE:
    Ray's own CLI fails there, the `trainlab` command turns token mode on itself (the clusters page). fp16
    on 2 workers may use either GPU type: cluster.placement=pack puts both on one node, spread
    one on each. cluster.min_capability=9.5, which no type has, is refused at submission with a
    reason per type, and the rest of the sweep runs (exit 1: a refused trial is a failed one)."""
    import mlflow

    env = {k: v for k, v in loopback_cluster.env.items() if k != "RAY_AUTH_MODE"}
    env |= {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONUNBUFFERED": "1", "COLUMNS": "250"}
    listed = _run(loopback_cluster, _readme(loopback_cluster, "ray", "job", "list"), env=env, timeout=120)
    assert listed.returncode != 0 and "Missing authentication token" in listed.stdout + listed.stderr, \
        listed.stdout[-2000:] + listed.stderr[-2000:]

    proc = subprocess.run(
        trainlab_cmd("train", "-m", "cluster=ray", f"cluster.address={loopback_cluster.gcs}",
                     *[o for o in FAST if not o.startswith("cluster.num_workers=")], "cluster.num_workers=2",
                     "precision=fp16", "cluster.placement=pack,spread", "cluster.min_capability=7.0,9.5", "hydra.launcher.max_concurrent_trials=1",
                     f"hydra.sweep.dir={tmp_path / 'multi'}"),
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=540)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "2 of 4 trials failed" in out, out[-4000:]
    refused = [line for line in proc.stdout.splitlines() if "refused at submission" in line]
    assert len(refused) == 2 and all("cluster.min_capability=9.5" in line for line in refused), out[-4000:]
    for reason in ("H100: compute capability 9.0 < cluster.min_capability=9.5",
                   "V100: compute capability 7.0 < cluster.min_capability=9.5"):
        assert out.count(reason) == 2, out[-4000:]

    client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("trainlab").experiment_id],
                              filter_string="tags.`trainlab.role` = 'trial'")
    landed = {r.data.params["cluster.placement"]: (r.data.tags["status"], r.data.tags["node_count"],
                                                   r.data.tags["device_types"]) for r in runs}
    assert sorted(landed) == ["pack", "spread"], landed  # the refused trials opened no run
    assert landed["spread"] == ("finished", "2", "H100:1,V100:1"), landed
    status, nodes, types = landed["pack"]
    assert (status, nodes) == ("finished", "1") and types in ("H100:2", "V100:2"), landed
