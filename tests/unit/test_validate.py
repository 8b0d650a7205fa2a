"""trainlab.config: every conf/ option composes, bad input fails with a useful message, and
the flat params / config hash / dict round trip behave as the tracker and Ray workers need."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from omegaconf import OmegaConf

from trainlab.config import (
    CONF_DIR,
    GROUPS,
    ConfigError,
    RunConfig,
    compose_run_config,
    config_hash,
    flatten,
    from_dict,
)
from trainlab.data import write_token_file
from trainlab.plan.derive_layout import plan_layout


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


GROUP_OPTIONS = [(g, o) for g in GROUPS for o in _options(g)]


@pytest.fixture(scope="module")
def token_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tokens") / "tokens.bin"
    write_token_file(path, np.arange(4096) % 100, "uint16")
    return str(path)


@pytest.fixture(scope="module")
def default_run() -> RunConfig:
    return compose_run_config([])


def _bad(overrides: list[str]) -> str:
    """The refusal of `overrides`: composition's, or the plan's where the layout cannot run."""
    with pytest.raises(ConfigError) as info:
        plan_layout(compose_run_config(overrides))
    return str(info.value)


# ---------------------------------------------------------------------------- every option
def test_every_group_has_options_on_disk():
    # guards the discovery below: a renamed conf/ folder must not silently test nothing
    for group in GROUPS:
        assert _options(group), f"conf/{group}/ has no options"


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS, ids=[f"{g}={o}" for g, o in GROUP_OPTIONS])
def test_every_option_composes_and_validates(group, option, token_file, tmp_path):
    overrides = [f"{group}={option}"]
    if group == "data" and option == "tokens":
        overrides += [f"data.path={token_file}", "data.vocab_size=100"]
    if group == "model" and option == "custom":
        overrides += ["model._target_=custom_model.build"]
    if group == "model" and option == "hf":
        from trainlab.models.hf_demo import demo_config

        demo_config("llama", vocab_size=256).to_json_file(tmp_path / "config.json")
        overrides += [f"model.config={tmp_path / 'config.json'}"]
    if group == "data" and option == "hf":  # composes without reading them: the preflight does
        overrides += ["data.path=docs.jsonl", "data.tokenizer=tokenizer"]
    run = compose_run_config(overrides)
    assert isinstance(run, RunConfig)
    section = getattr(run, group)
    if hasattr(section, "name"):
        # an option names its own mode; emulated_<x> and bf16_pure_<x> files are presets of
        # a mode (formats, the update's rounding), e.g. precision=emulated_fp4
        assert section.name == option or (group == "precision" and section.name in ("emulated", "bf16_pure")
                                          and option.startswith(f"{section.name}_"))


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


# ---------------------------------------------------------------------------- bad input
def test_world_size_must_equal_dp_tp_pp():
    msg = _bad(["parallel.dp=3", "cluster.num_workers=2"])
    assert "parallel.dp" in msg and "cluster.num_workers=2" in msg
    assert "3" in msg and "parallel.dp=0" in msg  # the fix: derive dp


def test_global_batch_must_divide_by_micro_times_dp():
    msg = _bad(["train.global_batch_size=10", "train.micro_batch_size=4", "cluster.num_workers=2"])
    assert "train.global_batch_size=10" in msg and "train.micro_batch_size" in msg
    assert "multiple of 8" in msg


def test_seq_len_above_model_context():
    context = OmegaConf.load(CONF_DIR / "model" / "tiny.yaml").max_seq_len
    msg = _bad(["model=tiny", f"train.seq_len={context + 1}"])
    assert f"train.seq_len={context + 1}" in msg and f"model.max_seq_len={context}" in msg
    assert "lower train.seq_len" in msg


def test_unknown_precision_name():
    msg = _bad(["precision.name=fp9"])
    assert "precision.name" in msg and "fp9" in msg
    assert "fp32" in msg and "bf16" in msg  # lists the choices


def test_unknown_device():
    msg = _bad(["cluster.device=tpu"])
    assert "cluster.device" in msg and "tpu" in msg and "cpu" in msg and "cuda" in msg


@pytest.mark.parametrize("override", [
    "train.max_steps=0",
    "train.micro_batch_size=-2",
    "model.n_layers=0",
    "model.n_heads=-4",
    "cluster.num_workers=0",
    "optim.lr=0",
    "precision.init_scale=-1",
    "parallel.bucket_cap_mb=0",
    "tracking.flush_every_s=-1",
    "tracking.outage_buffer=0",
    "tracking.close_timeout_s=-5",
])
def test_zero_and_negative_sizes(override):
    field, value = override.split("=")
    msg = _bad([override])
    assert field in msg
    assert str(float(value)) in msg or value in msg
    assert "positive" in msg and f"set {field}" in msg


def test_negative_dp_is_rejected():
    msg = _bad(["parallel.dp=-1"])
    assert "parallel.dp=-1" in msg and "0 = derive" in msg


def test_markov_needs_a_vocabulary():
    msg = _bad(["data=markov", "data.vocab_size=0"])
    assert "data.vocab_size=0" in msg


def test_tokens_without_path():
    msg = _bad(["data=tokens", "data.vocab_size=100"])
    assert "data.path" in msg and "data=tokens" in msg and "data.path=/path" in msg


def test_tokens_without_vocab_size(token_file):
    msg = _bad(["data=tokens", f"data.path={token_file}"])
    assert "data.vocab_size" in msg


def test_dim_not_divisible_by_heads():
    msg = _bad(["model=tiny", "model.dim=65", "model.n_heads=4", "model.n_kv_heads=0"])
    assert "model.dim=65" in msg and "model.n_heads=4" in msg


def test_odd_head_size():
    msg = _bad(["model=tiny", "model.dim=36", "model.n_heads=4", "model.n_kv_heads=0"])
    assert "head size" in msg and "9" in msg and "even" in msg


def test_kv_heads_must_divide_heads():
    msg = _bad(["model=tiny", "model.dim=96", "model.n_heads=6", "model.n_kv_heads=4"])
    assert "model.n_heads=6" in msg and "model.n_kv_heads=4" in msg


@pytest.mark.parametrize(("override", "field"), [
    ("optim.beta1=1.0", "optim.beta1"),
    ("optim.min_lr_ratio=1.5", "optim.min_lr_ratio"),
    ("optim.grad_clip=-1", "optim.grad_clip"),
    ("optim.weight_decay=-0.1", "optim.weight_decay"),
    ("precision.backoff_factor=1.5", "precision.backoff_factor"),
    ("precision.fp16_impl=fast", "precision.fp16_impl"),
    ("data.val_fraction=0", "data.val_fraction"),
])
def test_bad_values(override, field):
    value = override.split("=")[1]
    msg = _bad([override])
    assert field in msg
    assert value in msg or str(float(value)) in msg


def test_ray_cluster_without_address():
    msg = _bad(["cluster=ray", "cluster.address="])
    assert "cluster.address" in msg and "cluster=local" in msg


def test_unknown_group_option_lists_available_options():
    from hydra.errors import HydraException

    with pytest.raises(HydraException) as info:
        compose_run_config(["precision=fp8"])
    msg = str(info.value)
    assert "fp8" in msg
    for option in _options("precision"):
        assert option in msg


@pytest.mark.parametrize(("override", "says"), [
    ("+foo=bar", "no key 'foo'"),
    ("+train.nonsense=1", "train (TrainConfig) has no key 'nonsense'"),
    ("+train.max_step=5", "did you mean train.max_steps?"),
])
def test_keys_no_schema_has_are_refused_not_dropped(override, says):
    assert says in _bad([override])


@pytest.mark.parametrize("override", [
    "output_dir=../out", "output_dir=runs/../../out", "tracking.uri=sqlite:///../m.db",
    "tracking.uri=file:../mlruns", "tracking.uri=../mlruns",
])
def test_relative_paths_leaving_the_working_directory_are_refused(override):
    field, value = override.split("=", 1)
    msg = _bad([override])
    assert f"{field}={value!r}" in msg and "pass it as an absolute path" in msg


@pytest.mark.parametrize("override", [
    "output_dir=/tmp/out", "output_dir=runs/../out", "tracking.uri=sqlite:////tmp/../m.db",
    "tracking.uri=http://127.0.0.1:5000",
])
def test_absolute_and_inside_paths_are_allowed(override):
    compose_run_config([override])


def test_cluster_host_defaults_to_loopback():
    assert compose_run_config([]).cluster.host == "127.0.0.1"
    assert "cluster.host" in _bad(["cluster.host=' '"])


# ---------------------------------------------------------------------------- flat params, hash
def test_flatten_has_the_same_keys_for_every_config():
    a = flatten(compose_run_config(["precision=fp32"]))
    b = flatten(compose_run_config(["precision=fp16", "model=small"]))
    assert set(a) == set(b)
    assert a["precision.name"] == "fp32" and b["precision.name"] == "fp16"
    assert "model.dim" in a and "train.max_steps" in a and "seed" in a
    assert not any(dataclasses.is_dataclass(v) for v in a.values())


def test_config_hash_equal_for_equal_configs():
    a = compose_run_config(["model=tiny", "precision=bf16"])
    b = compose_run_config(["precision=bf16", "model=tiny"])
    assert a == b and config_hash(a) == config_hash(b)


@pytest.mark.parametrize("override", ["train.max_steps=201", "seed=1", "precision=fp16"])
def test_config_hash_changes_with_what_is_trained(override, default_run):
    assert config_hash(default_run) != config_hash(compose_run_config([override]))


@pytest.mark.parametrize("overrides", [
    ["tracking.uri=sqlite:////tmp/elsewhere.db", "tracking.experiment=other"],
    ["tracking=none"],
    ["output_dir=/tmp/some/where"],
])
def test_config_hash_ignores_where_results_go(overrides, default_run):
    other = compose_run_config(overrides)
    assert other != default_run  # the configs differ, only in where results go
    assert config_hash(other) == config_hash(default_run)


# ---------------------------------------------------------------------------- dict round trip
@pytest.mark.parametrize("overrides", [
    [],
    ["model=1b", "data=markov", "precision=fp16", "cluster=ray", "tracking=none", "seed=3",
     "output_dir=/tmp/out", "precision.init_scale=1024"],
])
def test_from_dict_round_trips(overrides):
    run = compose_run_config(overrides)
    back = from_dict(dataclasses.asdict(run))
    assert isinstance(back, RunConfig)
    assert back == run
    assert config_hash(back) == config_hash(run)


def test_options_the_chosen_modes_ignore_are_named():
    from trainlab.config import ignored_options

    assert ignored_options(compose_run_config(["model=tiny"])) == []
    notes = ignored_options(compose_run_config(["model=tiny", "precision=bf16", "precision.init_scale=1024",
                                                "data.path=/somewhere.bin"]))
    assert any("precision.init_scale" in n and "precision=bf16" in n for n in notes)
    assert any("data.path" in n and "data=tokens" in n for n in notes)
    assert ignored_options(compose_run_config(["model=tiny", "precision=fp16", "precision.init_scale=1024"])) == []


# ---------------------------------------------------------------------------- divergence policy
@pytest.mark.parametrize(("overrides", "says"), [
    (["train.on_divergence=retry"], ["train.on_divergence='retry'", "stop, rollback"]),
    (["train.rollback_lr_factor=0"], ["train.rollback_lr_factor=0.0", "(0, 1]"]),
    (["train.rollback_lr_factor=2"], ["train.rollback_lr_factor=2.0", "(0, 1]"]),
    (["train.max_rollbacks=0"], ["train.max_rollbacks=0"]),
    (["train.rollback_precision=fp8_delayed"], ["train.rollback_precision='fp8_delayed'", "fp32, bf16, fp16"]),
    (["train.on_divergence=rollback", "train.rollback_lr_factor=1"],
     ["would retry the same computation", "train.rollback_precision=fp32"]),
    (["precision=fp32", "train.rollback_precision=fp32"], ["train.rollback_precision=fp32", "own precision"]),
    (["precision=bf16", "train.rollback_precision=fp16"],
     ["train.rollback_precision=fp16 is not higher than precision=bf16", "use fp32"]),
])
def test_a_rollback_policy_that_cannot_help_is_refused(overrides, says):
    msg = _bad(["model=tiny", *overrides])
    for s in says:
        assert s in msg, msg


def test_a_rollback_may_move_up_to_more_range_or_precision():
    for own, fallback in (("fp16", "bf16"), ("fp8_delayed", "bf16"), ("bf16", "fp32"), ("emulated", "fp16")):
        run = compose_run_config(["model=tiny", f"precision={own}", "train.on_divergence=rollback",
                                  f"train.rollback_precision={fallback}"])
        assert run.train.rollback_precision == fallback


def test_rollback_options_without_the_rollback_policy_are_named_as_ignored():
    from trainlab.config import ignored_options

    notes = ignored_options(compose_run_config(["model=tiny", "train.rollback_lr_factor=0.1"]))
    assert any("train.rollback_lr_factor" in n and "train.on_divergence=rollback" in n for n in notes)
    assert ignored_options(compose_run_config(["model=tiny", "train.on_divergence=rollback"])) == []


# issue 28: refusals
@pytest.mark.parametrize(("overrides", "says"), [
    (["data=text", "model.vocab_size=100"],
     ["model.vocab_size=100", "corpus vocabulary (256, data=text)", "model.vocab_size=0", ">= 256"]),
    (["data=markov", "data.vocab_size=200", "model.vocab_size=100"],
     ["model.vocab_size=100", "(200, data=markov)", ">= 200"]),
    (["data=markov", "data.vocab_size=1"], ["data.vocab_size=1", "at least 2 states", "data.vocab_size>=2"]),
    (["data=markov", "data.vocab_size=5000"], ["data.vocab_size=5000", "GiB", "data.vocab_size<=4096"]),
])
def test_a_model_or_corpus_the_worker_could_not_build_is_refused_by_the_config(overrides, says):
    """Checks that used to run only in the worker (models.resolve_dims, data.markov), after Ray
    had started: now the config layer's, so a sweep holding such a trial is refused whole."""
    with pytest.raises(ConfigError) as e:
        compose_run_config(["model=tiny", *overrides])
    for part in says:
        assert part in str(e.value), str(e.value)


def test_a_larger_model_vocabulary_pads_the_corpus_one():
    assert compose_run_config(["model=tiny", "data=text", "model.vocab_size=320"]).model.vocab_size == 320
