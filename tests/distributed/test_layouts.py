"""Layouts through the real trainer (run_trial) on gloo: the loss curve equals one process's
with the same global batch and seed (fp32). zero2, hsdp and the GPipe / interleaved
schedules are matched against one process, parameters included, in test_fsdp.py and
test_pp.py; dp_tp, with clipping, a checkpoint and a resume, in test_dp_tp.py; zero2 also
trains here with bf16 (the layout x precision diagonal)."""

from __future__ import annotations

import pytest

from spawn_cases import selected_cases, spawn_cases, trial_curves_case
from trainlab import names

pytestmark = pytest.mark.distributed

TINY = ["model=tiny", "data=markov", "train.max_steps=6", "train.global_batch_size=8",
        "train.micro_batch_size=2", "train.seq_len=32", "train.eval_every=3", "train.eval_batches=4",
        "optim.warmup_steps=2", "optim.eps=1e-6", "train.numerics_every=0"]

# tiny's linears are too small for FP8 to pay (keep_hp 'small'): FP8 modes convert them anyway
EVERY_ALIGNED = ["precision.keep_hp=[output,unaligned]"]

# Every case of a world size runs in one spawned group, one trial after another as on a warm
# gang (spawn_cases): a fresh group per case cost more than the case. Each test asserts on its
# own case's result; a case's failure names it and every rank's error.
LAYOUTS = {  # case: (world, overrides)
    "fsdp": (2, ["parallel=fsdp"]),
    "zero1": (2, ["parallel=zero1"]),
    "tp": (2, ["parallel=tp"]),
    "tp_sp": (2, ["parallel=tp", "parallel.sequence_parallel=true"]),
    "fsdp_tp": (4, ["parallel=fsdp_tp"]),
    "pp_1f1b": (2, ["parallel=pp", "model.n_layers=4", "parallel.pp_schedule=1f1b"]),
    "dp_pp": (4, ["parallel=dp_pp", "model.n_layers=4"]),
}
WITH_PRECISION = {
    "fsdp_fp16": ["parallel=fsdp", "precision=fp16"],
    "zero2_bf16": ["parallel=zero2", "precision=bf16"],
    "zero1_fp8_delayed": ["parallel=zero1", "precision=fp8_delayed", "precision.hp_dtype=fp32", *EVERY_ALIGNED],
    "tp_emulated": ["parallel=tp", "precision=emulated", "precision.hp_dtype=fp32"],
    "pp_fp8_tensorwise": ["parallel=pp", "model.n_layers=4", "precision=fp8_tensorwise", "precision.hp_dtype=fp32",
                          *EVERY_ALIGNED],
}
FP16_COMM = ["parallel=ddp", "parallel.comm_dtype=fp16"]
COMPILED = {
    "fsdp": ["parallel=fsdp"],
    "pp": ["parallel=pp", "model.n_layers=4", "parallel.pp_schedule=1f1b"],
}
COMPILE = ["train.compile=true", "train.compile_unit=block"]


def _spawn(world: int, cases: dict[str, list[str]]) -> dict:
    return spawn_cases(trial_curves_case, world, {k: [*TINY, *o] for k, o in cases.items()}, timeout=300)


@pytest.fixture(scope="module")
def references():
    """One process: the 2-layer model, and the 4-layer one the pipelines cut into stages."""
    return _spawn(1, {"reference": [], "reference4": ["model.n_layers=4"]})


def _reference(references, overrides: list[str]):
    return references["reference4" if "model.n_layers=4" in overrides else "reference"].result()


@pytest.fixture(scope="module")
def two_ranks(request):
    """Every 2-rank case this session asserts on, in one group."""
    wanted = selected_cases(request)
    cases = {k: o for k, (w, o) in LAYOUTS.items() if w == 2 and k in wanted}
    cases |= {k: o for k, o in WITH_PRECISION.items() if k in wanted}
    if any(item.name == "test_fp16_gradient_communication_changes_little_and_trains" for item in request.session.items):
        cases["fp16_comm"] = FP16_COMM
    return _spawn(2, cases)


@pytest.fixture(scope="module")
def four_ranks(request):
    wanted = selected_cases(request)
    return _spawn(4, {k: o for k, (w, o) in LAYOUTS.items() if w == 4 and k in wanted})


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_layout_trains_like_one_process(request, references, case):
    world, overrides = LAYOUTS[case]
    ref_train, ref_val, _ = _reference(references, overrides)
    train, val, status = request.getfixturevalue("two_ranks" if world == 2 else "four_ranks")[case].result()
    assert status == names.STATUS_FINISHED
    assert train == pytest.approx(ref_train, rel=1e-5)
    assert val == pytest.approx(ref_val, rel=1e-5)


def test_fp16_gradient_communication_changes_little_and_trains(references, two_ranks):
    ref_train, _, _ = _reference(references, FP16_COMM)
    train, _, status = two_ranks["fp16_comm"].result()
    assert status == names.STATUS_FINISHED
    assert train == pytest.approx(ref_train, rel=1e-3)
    assert train != pytest.approx(ref_train, rel=1e-9)  # the rounding is real


@pytest.mark.parametrize("case", list(WITH_PRECISION))
def test_layout_composes_with_a_precision_mode(references, two_ranks, case):
    """Each layout with a low-precision mode (a diagonal of the layout x precision grid; the
    combinations that cannot work are refused before launch, tests/unit/test_preflight.py):
    trains, close to the fp32 curve but not on it (the low precision is really applied)."""
    ref_train, _, _ = _reference(references, WITH_PRECISION[case])
    train, _, status = two_ranks[case].result()
    assert status == names.STATUS_FINISHED
    assert train == pytest.approx(ref_train, rel=2e-2)
    assert train != pytest.approx(ref_train, rel=1e-6)


@pytest.fixture(scope="module")
def compiled(request):
    wanted = selected_cases(request, "compiled_case")
    return _spawn(2, {k: [*o, *COMPILE] for k, o in COMPILED.items() if k in wanted})


@pytest.mark.slow
@pytest.mark.parametrize("compiled_case", list(COMPILED))
def test_blocks_compiled_one_by_one_train_like_one_eager_process(references, compiled, compiled_case):
    ref_train, ref_val, _ = _reference(references, COMPILED[compiled_case])
    train, val, status = compiled[compiled_case].result()
    assert status == names.STATUS_FINISHED
    assert train == pytest.approx(ref_train, rel=1e-4)
    assert val == pytest.approx(ref_val, rel=1e-4)
