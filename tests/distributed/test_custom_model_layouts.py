"""model=custom: a user's own module (tests/custom_model.py, a GPT unlike trainlab's Llama) named
by model._target_, Hydra's convention. It trains like one process under DDP, ZeRO-1 and FSDP2 per
block of its `.layers`, composes with bf16 and FP8 (its own linears converted), and counts its
FLOPs from its own parameters; what trainlab cannot do with it is refused with the fix."""

from __future__ import annotations

import pytest

from spawn_cases import selected_cases, spawn_cases, trial_curves_case
from trainlab import names

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # the unit tests in the gate build and train it

RUN = ["model=custom", "model._target_=custom_model.build", "model.dim=64", "model.n_layers=2", "model.n_heads=4",
       "data=text", "train.max_steps=4", "train.global_batch_size=8", "train.micro_batch_size=2",
       "train.seq_len=32", "train.eval_every=2", "train.eval_batches=4", "optim.warmup_steps=1",
       "train.numerics_every=0"]
LAYOUTS = {"ddp": ["parallel=ddp"], "zero1": ["parallel=zero1"], "fsdp": ["parallel=fsdp"],
           "fsdp_checkpointed": ["parallel=fsdp", "parallel.activation_checkpoint=block"]}


@pytest.fixture(scope="module")
def reference():
    return spawn_cases(trial_curves_case, 1, {"one": RUN}, timeout=300)["one"]


@pytest.fixture(scope="module")
def two_ranks(request):
    wanted = selected_cases(request)
    return spawn_cases(trial_curves_case, 2, {k: [*RUN, *o] for k, o in LAYOUTS.items() if k in wanted}, timeout=300)


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_your_module_trains_like_one_process(reference, two_ranks, case):
    ref_train, ref_val, status = reference.result()
    assert status == names.STATUS_FINISHED
    assert ref_train[-1] < ref_train[0]  # it learns
    train, val, status = two_ranks[case].result()
    assert status == names.STATUS_FINISHED
    assert train == pytest.approx(ref_train, rel=1e-5)
    assert val == pytest.approx(ref_val, rel=1e-5)
