"""Test and benchmark instruments live in the `debug` section: set there, refused under their old
keys with the key to write, hashed as before the move, and a checkpoint written before it still
resumes; precision.fp8_impl=auto (it always ran native) is refused naming native."""

from __future__ import annotations

import json
import os

import pytest

from trainlab.config import ConfigError, compose_run_config, config_hash
from trainlab.config.checkpoints import META_FILE, CheckpointError, step_dir
from trainlab.config.convert import hashed_config
from trainlab.config.moved import MOVED_KEYS
from trainlab.config.overrides import check_overrides
from trainlab.config.schema import PrecisionConfig
from trainlab.engine import integrity
from trainlab.engine.resume import resolve_resume

TINY = ["model=tiny"]
FP8 = ("fp8_tensorwise", "fp8_rowwise", "fp8_rowwise_gw_hp", "fp8_delayed")


def refusal(*overrides: str) -> str:
    """The one line `trainlab train` prints for these overrides (ConfigError)."""
    with pytest.raises(ConfigError) as e:
        check_overrides(list(overrides))
    return str(e.value)


def test_the_debug_knobs_are_set_under_debug():
    run = compose_run_config([*TINY, "debug.inject_fault=sigkill@5:1", "debug.inject_nan=layers.1.feed_forward@3",
                              "debug.slowdown=[1,2]", "debug.logical_gpus=true"])
    assert run.debug.fault_injection == ("sigkill", 5, 1)
    assert run.debug.nan_injection == ("layers.1.feed_forward", 3)
    assert run.debug.slowdown == [1.0, 2.0] and run.debug.logical_gpus
    plain = compose_run_config(TINY).debug
    assert (plain.fault_injection, plain.nan_injection, plain.slowdown, plain.logical_gpus) == (None, None, [], False)


@pytest.mark.parametrize(("old", "value"), [("train.inject_fault", "sigkill@5:1"), ("train.inject_nan", "output@2"),
                                            ("cluster.slowdown", "[1,2]"), ("cluster.logical_gpus", "true")])
def test_an_old_key_is_refused_naming_the_key_to_write(old, value):
    new = MOVED_KEYS[old]
    assert refusal(*TINY, f"{old}={value}") == (
        f"{old}={value} is not a setting any more: test and benchmark knobs moved to the debug section; "
        f"write {new}={value}")
    assert f"; write {new}=" in refusal(*TINY, f"+{old}={value}")  # added with "+", too
    check_overrides([*TINY, f"{new}={value}"])  # and the key it names is accepted


def test_a_flag_spelling_of_a_debug_knob_names_its_key():
    assert "write debug.inject_fault=sigkill@2" in refusal("--inject_fault=sigkill@2")


@pytest.mark.parametrize(("overrides", "said"), [
    (["debug.slowdown=[2]"], ["debug.slowdown=[2.0]", "cluster.num_workers=2", "one per worker"]),
    (["debug.logical_gpus=true", "cluster.device=cuda"], ["debug.logical_gpus=true", "cluster.device=cpu"]),
    (["debug.inject_nan=layers.1"], ["debug.inject_nan='layers.1'", "MODULE@STEP"]),
])
def test_debug_knobs_are_checked_against_what_they_act_on(overrides, said):
    msg = refusal(*TINY, *overrides)
    assert all(s in msg for s in said), msg


@pytest.mark.parametrize("precision", FP8)
def test_fp8_impl_auto_is_gone_and_every_fp8_mode_runs_native_by_default(precision):
    assert compose_run_config([f"precision={precision}"]).precision.fp8_impl == "native"
    assert PrecisionConfig(name=precision).fp8_impl == "native"
    assert refusal(f"precision={precision}", "precision.fp8_impl=auto") == (
        "precision.fp8_impl=auto is no longer an option: it always ran as native; write "
        "precision.fp8_impl=native (the default) or leave it out")


def test_the_hash_covers_the_debug_knobs_it_covered_before_the_move():
    """inject_nan, slowdown and logical_gpus change what a run is (a poisoned, slowed or rehearsal
    run is not the trial it imitates); a fault does not: a rerun without it resumes the checkpoint."""
    base = config_hash(compose_run_config(TINY))
    assert config_hash(compose_run_config([*TINY, "debug.inject_fault=sigterm@3"])) == base
    for knob in ("debug.inject_nan=output@2", "debug.slowdown=[1,2]", "debug.logical_gpus=true"):
        assert config_hash(compose_run_config([*TINY, knob])) != base, knob
    assert {k for k in hashed_config(compose_run_config(TINY)) if k.startswith("debug.")} == {
        "debug.inject_nan", "debug.slowdown", "debug.logical_gpus"}


def written_before_the_move(fields: dict) -> dict:
    """A manifest's config fields as the code before the debug section recorded them."""
    back = {new: old for old, new in MOVED_KEYS.items()}
    old = {back.get(k, k): v for k, v in fields.items()}
    old["precision.fp8_impl"] = "auto"
    return integrity.as_json(old)


def checkpoint(root, config: dict):
    path = step_dir(root, 4)
    path.mkdir(parents=True)
    (path / "rank_0.pt").write_bytes(os.urandom(64))
    meta = {"version": 2, "step": 4, "config_hash": "before", "config": config,
            "files": integrity.describe_files(path, ["rank_0.pt"])}
    (path / META_FILE).write_text(json.dumps(integrity.seal(meta)))
    return path


def test_a_checkpoint_written_before_the_move_resumes_and_differences_name_todays_keys(tmp_path):
    trial = hashed_config(compose_run_config([*TINY, "precision=fp8_delayed", "debug.slowdown=[1,2]"]))
    path = checkpoint(tmp_path / "same", written_before_the_move(trial))
    assert resolve_resume("auto", tmp_path / "same", expect_config=trial).path == path
    other = hashed_config(compose_run_config([*TINY, "precision=fp8_delayed", "debug.slowdown=[1,3]"]))
    with pytest.raises(CheckpointError) as e:
        resolve_resume(str(path), tmp_path / "same", expect_config=other)
    assert "debug.slowdown [1.0, 2.0] vs [1.0, 3.0]" in str(e.value)
    assert "run with debug.slowdown=[1.0,2.0]" in str(e.value)
