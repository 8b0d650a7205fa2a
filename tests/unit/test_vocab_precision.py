"""Each precision mode is decided once (vocab.precision): every layer reads the same answer."""

from __future__ import annotations

import pytest
import torch

from trainlab.config import compose_run_config
from trainlab.config.schema import EmulatedFormats, PrecisionConfig
from trainlab.precision.capability import check_precision_supported
from trainlab.precision.recipes import build_recipe
from trainlab.vocab.precision import FP8_PRECISIONS, PRECISIONS, SPECS, emulates


@pytest.mark.parametrize("name", PRECISIONS)
def test_every_mode_builds_its_recipe_from_its_spec(name):
    cfg = PrecisionConfig(name=name, formats=EmulatedFormats(activations="e4m3"))
    recipe = build_recipe(cfg, device_type="cpu")
    assert isinstance(recipe, SPECS[name].recipe_class()) and recipe.name == name
    assert recipe.peak_dtype == SPECS[name].matmul_dtype(cfg.hp_dtype)


@pytest.mark.parametrize("name", PRECISIONS)
@pytest.mark.parametrize("impl", ["auto", "native", "emulated"])
def test_the_recipe_emulates_exactly_when_the_spec_says(name, impl):
    """Warm-gang isolation and the capability check read vocab.precision.emulates; the recipe
    that actually trains must agree with it (they were two copies of the rule before)."""
    fp16_impl = impl
    fp8_impl = "emulated" if impl == "emulated" else "native"
    cfg = PrecisionConfig(name=name, fp16_impl=fp16_impl, fp8_impl=fp8_impl,
                          formats=EmulatedFormats(activations="e4m3"))
    assert build_recipe(cfg, device_type="cpu").emulated == emulates(cfg, device_type="cpu")
    # on CUDA only the choice itself decides (auto fp16 is native there)
    assert emulates(cfg, device_type="cuda") == (name == "emulated" or impl == "emulated"
                                                 and (name == "fp16" or SPECS[name].fp8))


@pytest.mark.parametrize("name", FP8_PRECISIONS)
def test_fp8_modes_all_gather_in_their_high_precision_dtype(name):
    """FSDP2 used to all-gather the FP8 modes' parameters in fp32 (looked up by name, bf16
    only): twice bf16's bytes, skewing exactly the FP8-vs-BF16 comparison."""
    spec = SPECS[name]
    assert spec.fsdp_param_dtype("bf16", emulated=False) == torch.bfloat16
    assert spec.fsdp_param_dtype("bf16", emulated=False) == SPECS["bf16"].fsdp_param_dtype("bf16", emulated=False)
    assert spec.fsdp_param_dtype("fp32", emulated=False) is None


def test_fsdp_param_dtypes_of_the_other_modes():
    assert SPECS["fp32"].fsdp_param_dtype("bf16", emulated=False) is None
    assert SPECS["bf16_pure"].fsdp_param_dtype("bf16", emulated=False) is None  # already bf16
    assert SPECS["fp16"].fsdp_param_dtype("bf16", emulated=False) == torch.float16
    # emulated fp16 rounds its operands itself from fp32 parameters
    assert SPECS["fp16"].fsdp_param_dtype("bf16", emulated=True) is None


def test_rank_orders_compare_and_rollback_alike():
    from trainlab.compare.summarize import precision_rank

    assert [n for n in sorted(PRECISIONS, key=precision_rank)][:3] == ["fp32", "bf16", "fp16"]
    run = compose_run_config(["precision=fp16", "train.on_divergence=rollback", "train.rollback_precision=bf16"])
    assert run.train.rollback_precision == "bf16"
    with pytest.raises(ValueError, match=r"rollback_precision=fp16 is not higher than precision=bf16"):
        compose_run_config(["precision=bf16", "train.on_divergence=rollback", "train.rollback_precision=fp16"])


def test_rowwise_fp8_with_fp32_high_precision_needs_hopper():
    """cuBLAS has rowwise-scaled FP8 matmuls with an fp32 output for SM 9.0 only: refused on Ada
    before any worker starts, with the fix; fine on Hopper and with bf16."""
    for name in ("fp8_rowwise", "fp8_rowwise_gw_hp"):
        with pytest.raises(ValueError, match=r"precision.hp_dtype=fp32 needs compute capability 9.0\+.*"
                                             r"use precision.hp_dtype=bf16"):
            check_precision_supported(name, device="cuda", capability=(8, 9), device_name="NVIDIA L4",
                                      hp_dtype="fp32")
        check_precision_supported(name, device="cuda", capability=(9, 0), hp_dtype="fp32")
        check_precision_supported(name, device="cuda", capability=(8, 9), hp_dtype="bf16")
    check_precision_supported("fp8_tensorwise", device="cuda", capability=(8, 9), hp_dtype="fp32")


def test_tf32_is_ignored_outside_fp32_with_a_warning():
    from trainlab.config.validate import ignored_options

    run = compose_run_config(["precision=bf16", "precision.tf32=true"])
    assert any("precision.tf32 only applies to precision=fp32" in n for n in ignored_options(run))


@pytest.mark.parametrize("name", PRECISIONS)
def test_the_recipe_and_the_estimate_read_the_same_peak(name):
    """MFU's peak dtype (the recipe's) and the estimate's compute peak both come from
    PrecisionSpec.peak_dtype: with precision.tf32 on a GPU only fp32 moves to the TF32 peak, and
    a mode whose matmuls run in an fp32 hp_dtype (FP8, emulated) stays at the fp32 peak, as it runs."""
    from trainlab.estimate.hardware import hardware
    from trainlab.estimate.trial_estimate import estimate_trial
    from trainlab.plan.derive_layout import plan_layout
    from trainlab.vocab.nodes import ClusterSpec

    was = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        run = compose_run_config([f"precision={name}", "precision.tf32=true", "precision.hp_dtype=fp32",
                                  "cluster.device=cuda", "cluster.num_workers=1", "tracking=none"])
        recipe = build_recipe(run.precision, device_type="cuda")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = was
    assert recipe.peak_dtype == ("tf32" if name == "fp32" else SPECS[name].matmul_dtype("fp32"))
    est = estimate_trial(run, ClusterSpec.of_nodes(["1xH100"]), trial_layout=plan_layout(run))
    assert est.ranks[0].device.peak_tflops == hardware("H100").peak_tflops(recipe.peak_dtype)
