"""`trainlab.bench.checkpoint_cost` on 2 spawned gloo ranks: a few steps of `tiny` with and without
saves, and a report whose sizes match the model it saved."""

from __future__ import annotations

import math
import re

import pytest

from trainlab.bench.checkpoint_cost import report, spawn, summarise
from trainlab.config.checkpoints import complete_checkpoints
from trainlab.config.schema import TrainConfig

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 8-25 s of gloo groups: the gate keeps under 15 min

TRIAL = ["model=tiny", "cluster.device=cpu", "parallel=ddp", "train.max_steps=3", "train.seq_len=32",
         "train.global_batch_size=4", "train.micro_batch_size=2"]


def test_bench_checkpoint_reports_save_cost_and_size(tmp_path):
    rows = spawn(TRIAL, every=1, repeats=1, world=2, root=str(tmp_path))
    s = summarise(rows, every=1, world=2)

    # saves at steps 1 and 2 (none at the last step); the trial without saves wrote none
    assert s["num_saves"] == 2 and s["statuses"] == ["finished"], s
    assert [c.step for c in complete_checkpoints(tmp_path / "round0_every1")] == [1, 2]
    assert complete_checkpoints(tmp_path / "round0_every0") == []

    # DDP's replicas are saved once: fp32 parameters + AdamW's two moments = 12 bytes per
    # parameter, plus DCP's metadata and each rank's small state (a few % on `tiny`)
    assert s["num_params"] == 139_584  # tiny at the text corpus's 256-byte vocabulary
    assert 12.0 <= s["bytes_per_param"] < 15.0, s["bytes_per_param"]
    assert 0 < s["save_s_median"] <= s["save_s_max"] < 60
    assert 0 < s["step_s_median"] < 60 and s["num_steps_timed"] == 2
    assert math.isfinite(s["e2e_per_save_s"])
    assert s["interval"] == TrainConfig().checkpoint_every
    assert s["share"] == pytest.approx(s["save_s_median"] / (s["interval"] * s["step_s_median"]))

    # checksums: a part of each save; the driver's check before a resume reads both kept ones back
    assert 0 < s["checksum_s_median"] < s["save_s_median"]
    assert s["num_verified"] == 2 and 0 < s["verify_warm_s"] < 60 and 0 < s["verify_cold_s"] < 60
    assert s["verify_mib"] == pytest.approx(s["size_mb"], rel=0.01)

    lines = report(s)
    assert any(line.startswith("verify before a resume (2 checkpoints of") for line in lines), lines
    assert re.fullmatch(rf"amortised at every {s['interval']} steps: \d+\.\d% of step time \(target < 2%\)",
                        lines[-1]), lines
    assert any(line.startswith("save (2 saves): median") for line in lines), lines
