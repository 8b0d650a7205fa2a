"""Gangs kept warm between commands (hydra.launcher.keep_warm_s) on a running cluster, as a
user runs two sweeps one after the other against `ray start --head` on loopback: the second
sweep's trials run on the gang the first left, a trial gives the same bits there as first on a
fresh gang (the warm gangs' isolation proof, across commands), a kept gang ends once it has
been idle keep_warm_s, giving its CPUs back, and a trial that needs the CPUs a free kept gang of
another shape holds ends that gang rather than waiting behind it; and a free kept gang ends for
a placement group left waiting for what it holds (in-process, on the test worker's cluster)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from conftest import ray_head, trainlab_cmd

pytestmark = [pytest.mark.ray, pytest.mark.slow]

KEEP_S = 600
"""Warm between the commands: a command's start (compose, plan, join) takes 20-40 s on a loaded machine."""
IDLE_S = 5
"""The second command's keep_warm_s: how long its gang stays warm after it."""
COMMON = ["model=tiny", "train.max_steps=6", "train.eval_every=3", "train.seq_len=32", "train.global_batch_size=4",
          "train.micro_batch_size=4", "cluster.num_workers=1", "hydra.launcher.max_concurrent_trials=1",
          f"hydra.launcher.keep_warm_s={KEEP_S}"]

# a script run against the head: the names of the kept gangs' keepers and the CPUs free, as JSON
PROBE = ("import json, sys\n"
         "from trainlab.launch.ray_auth import token_mode\n"
         "from trainlab.config import compose_run_config\n"
         "from trainlab.launch.ray_trial import connect\n"
         "token_mode()\n"
         "connect(compose_run_config([f'cluster.address={sys.argv[1]}']))\n"
         "import ray\n"
         "from trainlab.launch.kept_gang import kept_gangs\n"
         "print(json.dumps({'kept': kept_gangs(), 'cpus': ray.available_resources().get('CPU', 0)}))\n")


def _sweep(head, tmp_path, name: str, seeds: str, *more: str):
    proc = subprocess.run(
        trainlab_cmd("train", "-m", f"seed={seeds}", *COMMON, *more, f"cluster.address={head.address}",
                     f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"tracking.experiment={name}",
                     f"hydra.sweep.dir={tmp_path / name}"),
        env=head.env | {"PYTHONUNBUFFERED": "1"}, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    return proc


def _trials(tmp_path, experiment: str) -> dict[str, tuple[str, float]]:
    """seed -> (its gang tag, its final val loss) of the experiment's trial runs."""
    from mlflow.tracking import MlflowClient

    from trainlab import names

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.{names.TAG_ROLE} = '{names.ROLE_TRIAL}'")
    return {r.data.params["seed"]: (r.data.tags[names.TAG_GANG], r.data.metrics[names.VAL_LOSS]) for r in runs}


def _probe(head) -> dict:
    import json

    out = subprocess.run([sys.executable, "-c", PROBE, head.address], env=head.env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_sweep_runs_on_the_gang_the_first_kept_which_ends_once_idle(tmp_path, mlflow_db):
    with ray_head(num_cpus=2) as head:
        _sweep(head, tmp_path, "first", "0,1")
        first = _trials(tmp_path, "first")
        assert first["0"][0].startswith("fresh: "), first
        assert first["1"][0].startswith("warm #2 on gang 1"), first
        assert len(_probe(head)["kept"]) == 1  # the command ended, its gang did not

        _sweep(head, tmp_path, "second", "2,0")
        second = _trials(tmp_path, "second")
        # no gang started: the one the first command kept, its 3rd and 4th trial
        assert second["2"][0] == "warm #3 on gang 1 (kept from an earlier command)", second
        assert second["0"][0] == "warm #4 on gang 1", second
        # after three trials in the same processes, seed 0 gives the bits it gave first on a fresh gang
        assert second["0"][1] == first["0"][1], (first, second)
        assert len(_probe(head)["kept"]) == 1  # kept again, for KEEP_S

        # a gang of 2 workers on the 2-CPU cluster, while the free kept gang of 1 worker holds a CPU
        # for KEEP_S more: it runs, so that gang was ended to make room
        _sweep(head, tmp_path, "wide", "4", "cluster.num_workers=2", "train.micro_batch_size=2",
               f"hydra.launcher.keep_warm_s={IDLE_S}")
        wide = _trials(tmp_path, "wide")
        assert wide["4"][0].startswith("fresh: "), wide

        # idle past the releasing command's keep_warm_s, its gang ends and every CPU is free again
        # (gang 1, kept for KEEP_S, would still hold one had the wide trial not ended it)
        deadline = time.monotonic() + IDLE_S + 90
        while (state := _probe(head))["kept"] and time.monotonic() < deadline:
            time.sleep(3)
        assert state == {"kept": [], "cpus": 2.0}, state


def test_a_free_kept_gang_ends_for_a_placement_group_that_waits_for_its_cpus(ray_cluster, tmp_path):
    """The race make_room cannot see: two gangs of one sweep starting at once each found room for
    itself beside a free kept gang, and the second waited behind it for its keep_warm_s (600 s in
    a CI run of 2026-12-07's tests on one cluster per worker). A free kept gang yields to any
    placement group left waiting for what it holds, whoever asked."""
    from trainlab.launch.kept_gang import kept_gangs, start_keeper

    ray = ray_cluster
    total = int(ray.cluster_resources()["CPU"])
    spec = {"name": "yield", "device": "cpu", "budget": 1, "storage_path": str(tmp_path / "ray"),
            "scaling": {"num_workers": 1, "use_gpu": False, "resources_per_worker": {"CPU": 1},
                        "placement_strategy": "PACK"}}
    keeper = start_keeper(key="yield-test", device="cpu", spec=spec, keep_warm_s=KEEP_S, owner="me")
    deadline = time.monotonic() + 180
    while ray.available_resources().get("CPU", 0) > total - 1:  # its worker holds a CPU
        assert time.monotonic() < deadline, "the kept gang's worker took no CPU in 180 s"
        time.sleep(0.5)
    ray.get(keeper.release.remote("me", [], KEEP_S))  # free, warm for KEEP_S

    whole = ray.util.placement_group([{"CPU": 1}] * total, strategy="PACK")  # every CPU, one held by the gang
    try:
        assert whole.wait(timeout_seconds=120), f"a placement group of {total} CPUs still waited after 120 s"
        # it ended, long before its KEEP_S; its keeper goes once the gang's run has (seconds later)
        deadline = time.monotonic() + 120
        while left := kept_gangs():
            assert time.monotonic() < deadline, f"the kept gang's keeper {left} was still there 120 s after it yielded"
            time.sleep(0.5)
    finally:
        ray.util.remove_placement_group(whole)
