"""A sweep on local Ray plans each trial once, before the first starts: its checks, its device
and its gang (placement) are decided once per trial, and the workers run that plan."""

from __future__ import annotations

import json
import time

import pytest

from trainlab import names
from trainlab.config import compose_run_config
from trainlab.events import TrialResult
from trainlab.launch import plan as launch_plan
from trainlab.launch.sweep import Trial, execute_sweep

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TRIAL = ["model=tiny", "data=markov", "train.max_steps=2", "train.global_batch_size=4", "train.micro_batch_size=4",
         "train.seq_len=32", "train.eval_every=0", "train.eval_batches=1", "cluster.num_workers=1", "tracking=none"]


def _counting(monkeypatch, name: str) -> list[float]:
    """When each call of launch.plan's `name` was made (perf_counter, the sweep's submission clock)."""
    calls, real = [], getattr(launch_plan, name)

    def counted(*args, **kwargs):
        calls.append(time.perf_counter())
        return real(*args, **kwargs)

    monkeypatch.setattr(launch_plan, name, counted)
    return calls


def test_each_trial_of_a_sweep_is_planned_and_placed_once(ray_cluster, tmp_path, monkeypatch):
    trials = [Trial(idx=i, overrides=[f"seed={i}"], run=compose_run_config(
        [*TRIAL, f"seed={i}", f"output_dir={tmp_path / f'trial{i}'}"])) for i in range(2)]
    checked, placed = _counting(monkeypatch, "preflight"), _counting(monkeypatch, "plan_gang")
    outcome = execute_sweep(trials, max_concurrent_trials=2, rerun=True)
    assert [t.status for t in outcome.ran] == [names.STATUS_FINISHED] * 2, [t.error for t in trials]
    assert len(checked) == 2 and len(placed) == 2  # once per trial (placement ran twice a trial before)
    assert max(checked + placed) < min(t.submitted_at for t in trials)  # all planned before the first starts
    for t in trials:
        assert isinstance(t.result, TrialResult) and t.result.steps == 2
        assert t.run.cluster.device == "auto" and t.plan.device == "cpu" and not t.plan.gang.gpus
        tags = {}
        for line in open(t.plan.paths.metrics):
            tags.update(json.loads(line).get("tags", {}))
        assert tags[names.TAG_DEVICE_NAME].startswith("cpu")  # what the workers computed on: the plan's
    assert trials[0].plan.config_hash != trials[1].plan.config_hash  # seeds differ: two trials


def test_a_trial_is_estimated_once_and_a_swept_one_is_not_checked_again(ray_cluster, tmp_path, monkeypatch):
    """A local trial's memory estimate is made once, by its preflight, and is its plan's; a
    sweep's trial planned with what the sweep's checks found of it is neither checked nor
    estimated again."""
    from trainlab.launch import preflight
    from trainlab.plan import trial_plan

    calls: list[str] = []
    for module, name in ((preflight, "estimate_run"), (trial_plan, "estimate_run"), (preflight, "check_data"),
                         (preflight, "check_device"), (preflight, "check_gang_cpus")):
        real = getattr(module, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    alone = compose_run_config([*TRIAL, f"output_dir={tmp_path / 'alone'}"])
    plan = launch_plan.plan_launch(alone)
    assert plan.estimate is not None and calls.count("estimate_run") == 1, calls
    swept = compose_run_config([*TRIAL, "seed=1", f"output_dir={tmp_path / 'swept'}"])
    (checks,) = preflight.check_sweep_trials([swept], ["#0 (seed=1)"])
    calls.clear()
    plan = launch_plan.plan_launch(swept, services=False, swept=checks)
    assert plan.estimate is checks.estimate and calls == [], calls
