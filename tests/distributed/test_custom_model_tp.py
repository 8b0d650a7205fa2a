"""model=custom with model.tp_plan through the real trainer: your own module (tests/custom_model.py's
build_split, q/k/v apart) sharded by a plan written in config trains like one process with 2
tensor-parallel ranks, and with data parallelism on top (replicate, FSDP2) on 4."""

from __future__ import annotations

import pytest

from custom_model import TP_PLAN
from spawn_cases import selected_cases, spawn_cases, trial_curves_case
from trainlab import names

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

PLAN = "model.tp_plan={" + ",".join(f"{k}:{v}" for k, v in TP_PLAN.items()) + "}"
RUN = ["model=custom", "model._target_=custom_model.build_split", "model.dim=64", "model.n_layers=2",
       "model.n_heads=4", PLAN, "data=text", "train.max_steps=4", "train.global_batch_size=8",
       "train.micro_batch_size=2", "train.seq_len=32", "train.eval_every=2", "train.eval_batches=4",
       "optim.warmup_steps=1", "train.numerics_every=0"]
LAYOUTS = {"tp": (2, ["parallel=tp"]), "dp_tp": (4, ["parallel=dp_tp"]), "fsdp_tp": (4, ["parallel=fsdp_tp"])}


@pytest.fixture(scope="module")
def reference():
    return spawn_cases(trial_curves_case, 1, {"one": RUN}, timeout=300)["one"]


@pytest.fixture(scope="module")
def layouts(request):
    wanted = selected_cases(request)
    out = {}
    for world in sorted({w for k, (w, _) in LAYOUTS.items() if k in wanted}):
        out.update(spawn_cases(trial_curves_case, world, {k: [*RUN, *o] for k, (w, o) in LAYOUTS.items()
                                                          if w == world and k in wanted}, timeout=300))
    return out


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_your_plan_trains_like_one_process(reference, layouts, case):
    ref_train, ref_val, status = reference.result()
    assert status == names.STATUS_FINISHED
    assert ref_train[-1] < ref_train[0]  # it learns
    train, val, status = layouts[case].result()
    assert status == names.STATUS_FINISHED
    assert train == pytest.approx(ref_train, rel=1e-5)
    assert val == pytest.approx(ref_val, rel=1e-5)
