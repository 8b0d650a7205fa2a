"""FP8 where it pays: by default fp8 modes keep the linears too small for FP8 matmuls in high
precision (keep_hp 'small', torchao's thresholds per recipe) and say so in the run's tags (an
FP8 trial left with no FP8 layer warns); train.compile=auto compiles on CUDA and stays eager on
CPU; float8 all-gather is decided in one place, with the reason when it is off."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import RecordingTracker
from trainlab import names
from trainlab.config import ConfigError, compose_run_config
from trainlab.engine.run import run_trial
from trainlab.models import build_model
from trainlab.plan.derive_layout import compile_unit, plan_layout
from trainlab.plan.here import plan_here
from trainlab.precision.fp8 import float8_all_gather
from trainlab.precision.policy import linear_layers, plan_layers
from trainlab.vocab.precision import FP8_PRECISIONS, spec_of

pytestmark = pytest.mark.usefixtures("one_thread")

PRESETS = ("tiny", "small", "125m", "350m", "1b", "7b")


def _tensorwise_pays(k: int, n: int) -> bool:
    """torchao's tensorwise auto filter for a weight N x K (H100 benchmarks)."""
    return not (k <= 4096 and n <= 1024)


def _rowwise_pays(k: int, n: int) -> bool:
    return not (n <= 2048 or k <= 1024 or (n <= 4096 and k <= 2048))


PAYS = {"tensorwise": _tensorwise_pays, "rowwise": _rowwise_pays}
# FP8 linears per preset with the default keep_hp (the README's table): tensorwise-scaled modes,
# rowwise-scaled modes; the output head is always kept
DEFAULT_FP8_LAYERS = {"tiny": (0, 0), "small": (0, 0), "125m": (24, 0), "350m": (48, 0),
                      "1b": (80, 32), "7b": (224, 224)}


@pytest.mark.parametrize("precision", FP8_PRECISIONS)
@pytest.mark.parametrize("preset", PRESETS)
def test_default_keep_hp_converts_only_the_linears_big_enough_for_fp8(preset, precision):
    run = compose_run_config([f"model={preset}", f"precision={precision}"])
    assert "small" in run.precision.keep_hp
    spec = spec_of(precision)
    with torch.device("meta"):  # 7b in no memory
        model = build_model(run.model, vocab_size=256)
    plan = plan_layers(model, run.precision.keep_hp, size_filter=spec.size_filter)
    pays = PAYS[spec.size_filter]
    for name, linear in linear_layers(model):
        if name == "output":
            assert plan.hp[name] == "output"
        elif pays(linear.in_features, linear.out_features):
            assert name in plan.lowp, (name, linear)
        else:
            assert plan.hp[name] == "small", (name, linear)
    want = DEFAULT_FP8_LAYERS[preset][0 if spec.size_filter == "tensorwise" else 1]
    assert len(plan.lowp) == want


def test_an_fp8_trial_without_fp8_layers_warns_and_its_tags_say_why(tmp_path):
    run = compose_run_config([
        "model=tiny", "data=markov", "precision=fp8_tensorwise", "precision.hp_dtype=fp32",
        "train.max_steps=2", "train.global_batch_size=4", "train.micro_batch_size=4", "train.seq_len=32",
        "train.eval_every=0", "train.eval_batches=1", "cluster.num_workers=1", "cluster.device=cpu",
        f"output_dir={tmp_path}"])
    tracker, events = RecordingTracker(), []
    result = run_trial(plan_here(run), tracker_factory=lambda *_: tracker, progress=events.append)
    assert result.status == names.STATUS_FINISHED
    tags = tracker.tags
    assert tags[names.TAG_FP8_LAYERS] == "0/15"
    kept, head = tags[names.TAG_HP_LAYERS].split("; ")
    assert kept.startswith("small: layers.0.attention.wq,") and len(kept.split(",")) == 14
    assert head == "output: output"
    warnings = [e.message for e in events if e.kind == "warning"]
    assert any("runs no FP8 layer" in w and "precision.keep_hp=[output,unaligned]" in w for w in warnings)
    assert tags[names.TAG_COMPILE] == "off"  # auto on CPU


def test_small_is_refused_where_no_fp8_kernel_runs():
    with pytest.raises(ConfigError) as info:
        compose_run_config(["precision=emulated", "precision.keep_hp=[output,small]"])
    assert "precision.keep_hp" in str(info.value) and "precision=emulated" in str(info.value)


# ---------------------------------------------------------------------------- compile
@pytest.mark.parametrize(("overrides", "device", "emulated", "want"), [
    ([], "cuda", False, "model"),
    (["precision=bf16"], "cuda", False, "model"),  # every mode: fp8 and bf16 compare compiled
    (["parallel=fsdp", "cluster.num_workers=2"], "cuda", False, "block"),  # FSDP2 needs per-block
    ([], "cpu", False, ""),
    (["precision=fp8_tensorwise", "precision.fp8_impl=emulated"], "cuda", True, ""),
    (["train.compile=true"], "cpu", False, "model"),
    (["train.compile=true", "train.compile_unit=block"], "cpu", False, "block"),
    (["train.compile=false"], "cuda", False, ""),
])
def test_compile_auto_compiles_on_cuda_and_true_false_mean_what_they_say(overrides, device, emulated, want):
    run = compose_run_config(["precision=fp8_tensorwise", *overrides])
    assert compile_unit(run, device_type=device, emulated=emulated) == want


def test_train_compile_takes_auto_true_false_and_refuses_the_rest():
    assert compose_run_config([]).train.compile == "auto"
    assert compose_run_config(["train.compile=true"]).train.compile == "true"
    assert compose_run_config(["train.compile=False"]).train.compile == "false"
    with pytest.raises(ConfigError) as info:
        compose_run_config(["train.compile=yes"])
    assert "train.compile='yes'" in str(info.value) and "auto, true, false" in str(info.value)
    # an explicit whole-model graph still cannot be sharded afterwards
    with pytest.raises(ConfigError, match="train.compile_unit=block"):
        plan_layout(compose_run_config(["parallel=fsdp", "cluster.num_workers=2", "train.compile=true"]))


# ---------------------------------------------------------------------------- float8 all-gather
def _tiny():
    return build_model(compose_run_config(["model=tiny"]).model, vocab_size=64)


def _aligned(model: nn.Module) -> list[str]:
    return [n for n, m in linear_layers(model) if n != "output"]


@pytest.mark.parametrize(("precision", "backend", "why"), [
    ("fp8_tensorwise", "nccl", ""),
    ("fp8_tensorwise", "gloo", ""),  # every group also holds norm weights: gathered as bytes
    ("fp8_tensorwise", "", "no FSDP2"),
    ("fp8_rowwise", "nccl", "tensorwise"),
    ("fp8_rowwise_gw_hp", "nccl", "tensorwise"),
    ("fp8_delayed", "nccl", "not a torchao recipe"),
])
def test_float8_all_gather_is_on_only_where_torchao_and_the_backend_can(precision, backend, why):
    model = _tiny()
    got = float8_all_gather(precision, fsdp_backend=backend, model=model, layers=_aligned(model))
    if not why:
        assert got.enabled and got.tag == "true"
    else:
        assert not got.enabled and got.tag.startswith("false: ") and why in got.tag


def test_gloo_cannot_all_gather_a_group_of_float8_weights_only():
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Linear(64, 64, bias=False)])
    got = float8_all_gather("fp8_tensorwise", fsdp_backend="gloo", model=model, layers=["layers.0"])
    assert not got.enabled and "gloo" in got.reason and "layers.0" in got.reason
    assert float8_all_gather("fp8_tensorwise", fsdp_backend="nccl", model=model, layers=["layers.0"]).enabled
