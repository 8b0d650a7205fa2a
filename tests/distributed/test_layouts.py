"""Layouts through the real trainer (run_trial) on gloo: the loss curve equals one process's
with the same global batch and seed (fp32). zero2, hsdp and the GPipe / interleaved
schedules are matched against one process, parameters included, in test_fsdp.py and
test_pp.py; dp_tp, with clipping, a checkpoint and a resume, in test_dp_tp.py; zero2 also
trains here with bf16 (the layout x precision diagonal)."""

from __future__ import annotations

import pytest

from conftest import spawn_ranks, trial_curves
from trainlab import names

pytestmark = pytest.mark.distributed

TINY = ["model=tiny", "data=markov", "train.max_steps=6", "train.global_batch_size=8",
        "train.micro_batch_size=2", "train.seq_len=32", "train.eval_every=3", "train.eval_batches=4",
        "optim.warmup_steps=2", "optim.eps=1e-6", "train.numerics_every=0"]

# tiny's linears are too small for FP8 to pay (keep_hp 'small'): FP8 modes convert them anyway
EVERY_ALIGNED = ["precision.keep_hp=[output,unaligned]"]


def _run(world: int, overrides: list[str]):
    (got,) = spawn_ranks(trial_curves, world, [*TINY, *overrides], timeout=300)
    return got


@pytest.fixture(scope="module")
def reference():
    return _run(1, [])


@pytest.fixture(scope="module")
def reference4():
    """The 4-layer model the pipelines cut into stages."""
    return _run(1, ["model.n_layers=4"])


@pytest.mark.parametrize(("world", "overrides"), [
    (2, ["parallel=fsdp"]),
    (2, ["parallel=zero1"]),
    (2, ["parallel=tp"]),
    (2, ["parallel=tp", "parallel.sequence_parallel=true"]),
    (4, ["parallel=fsdp_tp"]),
    (2, ["parallel=pp", "model.n_layers=4", "parallel.pp_schedule=1f1b"]),
    (4, ["parallel=dp_pp", "model.n_layers=4"]),
], ids=["fsdp", "zero1", "tp", "tp_sp", "fsdp_tp", "pp_1f1b", "dp_pp"])
def test_layout_trains_like_one_process(request, world, overrides):
    fixture = "reference4" if "model.n_layers=4" in overrides else "reference"
    ref_train, ref_val, _ = request.getfixturevalue(fixture)
    train, val, status = _run(world, overrides)
    assert status == names.STATUS_FINISHED
    assert train == pytest.approx(ref_train, rel=1e-5)
    assert val == pytest.approx(ref_val, rel=1e-5)


def test_fp16_gradient_communication_changes_little_and_trains(reference):
    ref_train, _, _ = reference
    train, _, status = _run(2, ["parallel=ddp", "parallel.comm_dtype=fp16"])
    assert status == names.STATUS_FINISHED
    assert train == pytest.approx(ref_train, rel=1e-3)
    assert train != pytest.approx(ref_train, rel=1e-9)  # the rounding is real


@pytest.mark.parametrize("overrides", [
    ["parallel=fsdp", "precision=fp16"],
    ["parallel=zero2", "precision=bf16"],
    ["parallel=zero1", "precision=fp8_delayed", "precision.hp_dtype=fp32", *EVERY_ALIGNED],
    ["parallel=tp", "precision=emulated", "precision.hp_dtype=fp32"],
    ["parallel=pp", "model.n_layers=4", "precision=fp8_tensorwise", "precision.hp_dtype=fp32", *EVERY_ALIGNED],
], ids=["fsdp_fp16", "zero2_bf16", "zero1_fp8_delayed", "tp_emulated", "pp_fp8_tensorwise"])
def test_layout_composes_with_a_precision_mode(request, overrides):
    """Each layout with a low-precision mode (a diagonal of the layout x precision grid; the
    combinations that cannot work are refused before launch, tests/unit/test_preflight.py):
    trains, close to the fp32 curve but not on it (the low precision is really applied)."""
    fixture = "reference4" if "model.n_layers=4" in overrides else "reference"
    ref_train, _, _ = request.getfixturevalue(fixture)
    train, _, status = _run(2, overrides)
    assert status == names.STATUS_FINISHED
    assert train == pytest.approx(ref_train, rel=2e-2)
    assert train != pytest.approx(ref_train, rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [
    ["parallel=fsdp"],
    ["parallel=pp", "model.n_layers=4", "parallel.pp_schedule=1f1b"],
], ids=["fsdp", "pp"])
def test_blocks_compiled_one_by_one_train_like_one_eager_process(request, overrides):
    fixture = "reference4" if "model.n_layers=4" in overrides else "reference"
    ref_train, ref_val, _ = request.getfixturevalue(fixture)
    train, val, status = _run(2, [*overrides, "train.compile=true", "train.compile_unit=block"])
    assert status == names.STATUS_FINISHED
    assert train == pytest.approx(ref_train, rel=1e-4)
    assert val == pytest.approx(ref_val, rel=1e-4)
