"""`trainlab bench study` at smoke size: the grid and the study each run through `trainlab train -m`,
and it prints each one's parents, gang starts and ratio, then their comparison. (The pruned study,
the study's command with hydra.launcher.prune, and its line: tests/unit/test_bench_study_lines.py,
since 2026-12-07; at 2 trials with 2 startup trials it could prune nothing, and repeated the study.)"""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_bench_study_runs_a_grid_and_a_study_of_the_same_budget_side_by_side(capsys):
    from trainlab.bench.study_search import main

    # 2 trials one at a time: the study is still two batches, and one gang (the concurrency's) runs
    # both; 4 trials two at a time proved the same at twice the trials and gang starts (411 s in CI)
    main(["--trials", "2", "--concurrency", "1", "--no-pruned", "--choice", "optim.warmup_steps=0,5", "model=tiny",
          "train.max_steps=10", "train.eval_every=2", "train.seq_len=32"])
    out = capsys.readouterr().out
    ratios = dict(re.findall(r"^ratio \((grid|study|pruned)\): (\d+\.\d{3})$", out, flags=re.M))
    assert set(ratios) == {"grid", "study"}, out[-3000:]
    assert all(float(r) > 1.0 for r in ratios.values()), ratios  # composing, starting and tracking are never free
    # the study's two batches: one parent, the concurrency's gang (not one per batch)
    assert re.search(r"^study: 2 trials, 1 parent run\(s\), 1 gangs started, concurrency 1", out, flags=re.M), out[-3000:]
    assert re.search(r"^study vs grid: best val loss \d\.\d{4} vs \d\.\d{4} \((same or better|worse)\)", out, flags=re.M)
