"""The update-to-weight ratio of sampled steps means the same on every layout: measured on
local shards (FSDP2, tensor parallel) or on the ZeRO-1 partition a rank steps, it equals the
one-process ratio."""

from __future__ import annotations

import pytest

from conftest import RecordingTracker, rank_env, reporting_to, spawn_ranks
from trainlab import names

pytestmark = pytest.mark.distributed

BASE = ["model=tiny", "data=markov", "train.max_steps=3", "train.global_batch_size=8",
        "train.micro_batch_size=2", "train.seq_len=32", "train.eval_every=0", "train.numerics_every=2",
        "optim.warmup_steps=1", "tracking=none"]
LAYOUTS = ("ddp", "zero1", "fsdp", "tp")


def _ratios(layout_overrides: list[str], dist_info) -> dict[int, tuple[float, float]]:
    from trainlab.config import compose_run_config
    from trainlab.engine.run import build_trainer
    from trainlab.plan.trial_plan import Where, plan_trial
    from trainlab.telemetry import peak_flops
    from trainlab.telemetry.peak_flops import Peak

    run = compose_run_config([*BASE, *layout_overrides, f"cluster.num_workers={dist_info.world_size}"])
    tracker = RecordingTracker()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(peak_flops, "cpu_probe_peak", lambda dtype, **_: Peak(1e11, f"probe:cpu:{dtype}"))
        trainer = build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info, tracker=tracker)
    trainer.train()
    total, largest = tracker.by_step(names.UPDATE_TO_WEIGHT), tracker.by_step(names.UPDATE_TO_WEIGHT_MAX)
    return {step: (total[step], largest[step]) for step in total}


def _layouts(rank: int, world: int, port: int, out) -> None:
    rank_env(rank, world, port)
    from trainlab.distributed import setup_distributed

    with reporting_to(out):
        dist_info = setup_distributed("cpu")
        got = {layout: _ratios([f"parallel={layout}"], dist_info) for layout in LAYOUTS}
        if rank == 0:
            out.put(got)


def test_update_to_weight_is_the_one_process_ratio_on_every_layout(dist_info):
    reference = _ratios([], dist_info)
    assert sorted(reference) == [1, 2]  # sampled: the first step and every 2nd
    (got,) = spawn_ranks(_layouts, 2, timeout=600)
    for layout in LAYOUTS:
        assert sorted(got[layout]) == [1, 2], layout
        for step, (total, largest) in reference.items():
            assert got[layout][step][0] == pytest.approx(total, rel=1e-4), (layout, step)
            assert got[layout][step][1] == pytest.approx(largest, rel=1e-4), (layout, step)
