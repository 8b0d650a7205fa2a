"""Which trial may follow which on a warm gang (engine.isolation.fresh_gang_reason), decided on
the driver from the configs: on CUDA a change of train.deterministic (cuBLAS's workspace is
sized once per process) and a compiled trial after a torchao FP8 one (torchao patched
inductor's code generation for good) need fresh processes; on CPU everything is put back."""

from __future__ import annotations

import functools

import pytest

from trainlab.config import compose_run_config
from trainlab.engine.isolation import compiles, fresh_gang_reason

BASE = ["model=tiny", "data=markov", "cluster.num_workers=1"]


@functools.cache
def run(*overrides: str):
    return compose_run_config([*BASE, *overrides])


FP32 = ("precision=fp32",)
DETERMINISTIC = ("precision=fp32", "train.deterministic=true")
FP8 = ("precision=fp8_tensorwise",)
BF16_COMPILED = ("precision=bf16", "train.compile=true")


def test_the_first_trial_of_a_gang_and_every_trial_on_cpu_may_run_warm():
    assert fresh_gang_reason(ran=[], run=run(*DETERMINISTIC), device="cuda") == ""
    for ran, then in [(FP32, DETERMINISTIC), (DETERMINISTIC, FP32), (FP8, BF16_COMPILED)]:
        assert fresh_gang_reason(ran=[run(*ran)], run=run(*then), device="cpu") == ""


@pytest.mark.parametrize("first, then", [(FP32, DETERMINISTIC), (DETERMINISTIC, FP32)])
def test_on_cuda_a_change_of_deterministic_mode_needs_a_fresh_gang(first, then):
    reason = fresh_gang_reason(ran=[run(*first)], run=run(*then), device="cuda")
    assert "train.deterministic" in reason and "CUBLAS_WORKSPACE_CONFIG" in reason
    assert "\n" not in reason  # one line, recorded on the trial's run


def test_on_cuda_the_gangs_first_trial_decides_the_deterministic_mode():
    """cuBLAS keeps the workspace of the gang's first matmul: a later deterministic trial on a
    deterministic gang may follow whatever ran in between."""
    ran = [run(*DETERMINISTIC), run("precision=bf16", "train.deterministic=true")]
    assert fresh_gang_reason(ran=ran, run=run(*DETERMINISTIC), device="cuda") == ""
    assert fresh_gang_reason(ran=ran, run=run(*FP32), device="cuda") != ""


def test_on_cuda_a_compiled_trial_after_a_torchao_fp8_one_needs_a_fresh_gang():
    reason = fresh_gang_reason(ran=[run(*FP32), run(*FP8)], run=run(*BF16_COMPILED), device="cuda")
    assert "fp8_tensorwise" in reason and "torchao" in reason and "inductor" in reason
    # auto compiles on CUDA (bf16 runs natively there)
    assert fresh_gang_reason(ran=[run(*FP8)], run=run("precision=bf16"), device="cuda") != ""


@pytest.mark.parametrize("then", [
    ("precision=bf16", "train.compile=false"),  # nothing compiled: inductor's code generation unused
    ("precision=fp8_rowwise", "train.compile=true"),  # a torchao FP8 trial patches before it compiles
    ("precision=fp16", "precision.fp16_impl=emulated"),  # auto does not compile emulated casts
])
def test_on_cuda_trials_that_do_not_meet_the_patch_follow_an_fp8_one(then):
    assert fresh_gang_reason(ran=[run(*FP8)], run=run(*then), device="cuda") == ""


def test_compiles_resolves_auto_as_build_trainer_does():
    assert compiles(run("precision=bf16"), device="cuda")
    assert not compiles(run("precision=bf16"), device="cpu")
    assert not compiles(run("precision=fp8_tensorwise", "precision.fp8_impl=emulated"), device="cuda")
    assert compiles(run("precision=fp8_tensorwise", "precision.fp8_impl=emulated", "train.compile=true"),
                    device="cuda")
