"""`trainlab bench prune` at smoke size on the shared local Ray cluster: the same sweep unpruned and
pruned, its table, and the compute-saved line with the wall-time ratio in the README's format."""

from __future__ import annotations

import math
import re

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SAVED = re.compile(r"^compute saved: (-?\d+\.\d)% of the tokens \((-?\d+\.\d)% of the steps\); "
                   r"wall time (\d+\.\d{2})x$", re.M)


def test_bench_prune_prints_both_sweeps_and_the_compute_saved(ray_cluster, capsys):
    from trainlab.bench.prune_savings import main

    # 2 learning rates far apart, so the pruned sweep finds the unpruned one's best (else exit 1); one
    # at a time: each sweep starts one gang, not two (the margin rule compares with finished trials too)
    try:
        main(["--precisions", "fp32", "--lrs", "1e-4,3e-2", "--concurrency", "1", "--rule", "margin",
              "train.max_steps=12", "train.eval_every=3", "train.seq_len=32"])
    except SystemExit as e:  # the bench's own verdict: a best configuration lost, or a trial failed
        pytest.fail(f"exit {e.code}:\n{capsys.readouterr().out[-3000:]}")
    out = capsys.readouterr().out
    assert "pruning (margin): same sweep, unpruned and pruned" in out, out[-3000:]
    (saved,) = SAVED.findall(out)
    tokens, steps, wall = (float(x) for x in saved)
    assert 0 <= tokens < 100 and 0 <= steps < 100, saved  # pruning never adds work
    assert math.isfinite(wall) and wall > 0, saved
    assert re.search(r"^same best configuration: yes$", out, flags=re.M), out[-3000:]
