"""`trainlab bench sweep` at smoke size: the three modes run their trials on the shared local Ray
cluster and print their numbers and ratios side by side, with the comparison lines; the second
sweep starts no gang (it runs on the one the warm sweep kept), and no kept gang outlives the bench."""

from __future__ import annotations

import re
import time

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_bench_sweep_prints_both_modes_and_their_ratios(ray_cluster, capsys):
    from trainlab.bench.sweep_overhead import main

    main(["--trials", "2", "--concurrency", "1", "--no-warmup", "train.max_steps=3", "train.seq_len=32",
          "tracking=none"])
    out = capsys.readouterr().out
    ratios = dict(re.findall(r"^ratio \(([a-z, -]+)\): (\d+\.\d{3})$", out, flags=re.M))
    assert set(ratios) == {"per-trial gangs", "warm gangs", "kept-warm gangs, second sweep"}, out[-3000:]
    assert all(float(r) > 1.0 for r in ratios.values())  # start-up and tracking are never free
    assert "per-trial gangs: 2 trials, concurrency 1" in out and "gangs started 2" in out, out[-3000:]
    # the warm sweep's second trial ran on the first one's gang, and its start latency was measured
    assert re.search(r"^warm gangs: .*gangs started 1$", out, flags=re.M), out[-3000:]
    assert re.search(r"later trials of a warm gang \d+\.\ds \(1\)", out), out[-3000:]
    assert re.search(r"^warm gangs vs per-trial gangs: wall .* ratio \d+\.\d{3} vs \d+\.\d{3}", out, flags=re.M)
    # the second sweep: its first trial on the gang the first sweep kept, no gang started
    assert re.search(r"^kept-warm gangs, second sweep: .*gangs started 0$", out, flags=re.M), out[-3000:]
    assert re.search(r"^kept-warm gangs, second sweep: the sweep's first trial starts in \d+\.\ds$", out,
                     flags=re.M), out[-3000:]
    assert re.search(r"^kept-warm gangs, second sweep vs per-trial gangs: wall ", out, flags=re.M), out[-3000:]
    from trainlab.launch.kept_gang import kept_gangs

    deadline = time.monotonic() + 60  # ended by the bench: gone once their gang's run returned
    while kept_gangs() and time.monotonic() < deadline:
        time.sleep(1)
    assert kept_gangs() == []
