"""A trial planned once: workers execute the TrialPlan they are handed (its device, its identity,
no validation again), and what they report back is typed (trainlab.events) end to end."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

from conftest import RecordingTracker
from trainlab import names
from trainlab.config import compose_run_config, from_dict
from trainlab.config import convert as config_load
from trainlab.config import schema as config_schema
from trainlab.console import ProgressLine, console, status_text
from trainlab.devices import resolve_device
from trainlab.engine.run import run_trial
from trainlab.events import Notice, StepDone, TrialFinished, TrialResult, TrialStarted
from trainlab.launch.preflight import check_device
from trainlab.plan.here import plan_here
from trainlab.plan.trial_plan import Where, plan_trial
from trainlab.tracking.runs import closing_tags

TINY = ["model=tiny", "data=markov", "train.max_steps=3", "train.global_batch_size=4", "train.micro_batch_size=4",
        "train.seq_len=32", "train.eval_every=3", "train.eval_batches=1", "train.log_every=1",
        "cluster.num_workers=1", "tracking=none"]


@pytest.fixture
def counted_field_checks(monkeypatch):
    """How often a config section checks its fields (every __post_init__ does, first thing)."""
    calls = []
    real = config_schema.check_fields

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(config_schema, "check_fields", counting)
    return calls


def test_the_plan_crosses_to_a_worker_without_being_validated_again(tmp_path, counted_field_checks):
    """Ray pickles the payload; a worker used to rebuild the config from a dict, running every
    section's checks again (config.from_dict, ~27 ms a worker)."""
    plan = plan_here(compose_run_config([*TINY, f"output_dir={tmp_path}"]))
    counted_field_checks.clear()
    received = pickle.loads(pickle.dumps(plan))
    assert counted_field_checks == []
    assert received == plan and received.device == "cpu" and received.config_hash == plan.config_hash
    from_dict(dataclasses.asdict(plan.run))  # what a worker did before
    assert len(counted_field_checks) >= 8  # every section checked again


def test_a_worker_computes_on_the_plans_device_and_checks_nothing_again(tmp_path, monkeypatch):
    """cluster.device=auto is resolved once, by the planner; the engine reads plan.device. Here
    torch says a GPU is visible after the plan chose cpu: a worker that resolved `auto` itself
    would try CUDA (no such device in this build) instead of running the plan."""
    run = compose_run_config([*TINY, f"output_dir={tmp_path}"])
    assert run.cluster.device == "auto"
    plan = plan_trial(run, Where(device="cpu", checkpoint_root=str(tmp_path / "ckpt")))

    def refuse(*_a, **_k):
        raise AssertionError("the worker validated or rebuilt the config again")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # torch's optimizers then ask CUDA whether a graph is being captured: a CPU build answers
    # no, a CUDA build without a driver (torch 2.11.0+cu130 here) raises
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    for name in ("check_run", "from_dict", "to_run_config"):
        monkeypatch.setattr(config_load, name, refuse)
    tracker = RecordingTracker()
    result = run_trial(pickle.loads(pickle.dumps(plan)), tracker_factory=lambda *_: tracker)
    assert result.status == names.STATUS_FINISHED
    assert str(tracker.tags[names.TAG_DEVICE_NAME]).startswith("cpu")
    # the checkpoint folder the plan chose, not one derived from the config again
    assert (tmp_path / "ckpt" / "restarts").is_file() and not (tmp_path / "checkpoints").exists()


def test_auto_is_decided_by_one_function_and_logical_gpus_compute_on_cpu(monkeypatch):
    assert resolve_device("auto", gpus=True) == "cuda"
    assert resolve_device("auto", gpus=False) == "cpu"
    assert resolve_device("auto", gpus=True, logical_gpus=True) == "cpu"
    assert resolve_device("cpu", gpus=True) == "cpu"
    # the driver's check of a local cluster asks the same function: with debug.logical_gpus the
    # workers compute on CPU even where torch sees a GPU (it used to say cuda here)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    run = compose_run_config([*TINY, "debug.logical_gpus=true"])
    assert check_device(run) == "cpu"
    assert plan_here(run).device == "cpu"


def test_events_and_the_result_are_typed_from_the_engine_to_the_console(tmp_path):
    events = []
    run = compose_run_config([*TINY, "precision=fp8_tensorwise", "precision.hp_dtype=fp32", f"output_dir={tmp_path}"])
    result = run_trial(plan_here(run), tracker_factory=lambda *_: RecordingTracker(), progress=events.append)
    # pickled as Ray's event queue carries them, read back as the same types
    events, result = pickle.loads(pickle.dumps((events, result)))
    assert isinstance(result, TrialResult) and result.status == names.STATUS_FINISHED
    (started,) = [e for e in events if isinstance(e, TrialStarted)]
    assert (started.step, started.max_steps, started.world_size, started.kind) == (0, 3, 1, "start")
    steps = [e for e in events if isinstance(e, StepDone)]
    assert [e.step for e in steps] == [1, 2, 3] and all(e.kind == "step" for e in steps)
    assert [e.val_loss is not None for e in steps] == [False, False, True]
    notices = [e for e in events if isinstance(e, Notice)]
    assert notices and all(e.kind == "warning" for e in notices)  # no FP8 layer in the tiny model
    assert {type(e) for e in events} <= {TrialStarted, StepDone, Notice}
    assert TrialFinished(result).kind == "result"
    line = ProgressLine(description="t")
    with console.capture() as cap:
        for e in events:
            line(e)
        line.close()
    shown = cap.get()
    assert "step 3/3" in shown and "runs no FP8 layer" in shown
    assert status_text(result.status, result) == "finished"
    assert closing_tags(result, "") == {}
