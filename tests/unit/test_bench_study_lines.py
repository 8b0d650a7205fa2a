"""`trainlab bench study`'s report from its multiruns' records (bench.study_search.main): the
lines each multirun and each comparison prints, the pruned study's compute saved among them.
The multiruns themselves run through `trainlab train -m` in tests/integration/test_bench_study.py,
which runs the grid and the study only (the pruned study's real run is the study's command with
hydra.launcher.prune: pruning through the real CLI in tests/integration/test_prune_sweep.py, a
pruned trial reaching Optuna's study in tests/unit/test_study_rules.py)."""

from __future__ import annotations

import re
from types import SimpleNamespace

from trainlab import names
from trainlab.bench import study_search


def _trial(overrides: str, val: float, tokens: int):
    return SimpleNamespace(data=SimpleNamespace(
        tags={names.TAG_STATUS: names.STATUS_FINISHED, names.TAG_OVERRIDES: overrides},
        metrics={names.VAL_LOSS: val, names.TOKENS_SEEN: tokens}))


def _multirun(mode: str, trials: list, *, gangs: list[str], wall_s: float) -> study_search.Multirun:
    rows = [{"gang": g, "train_s": 10.0} for g in gangs]
    return study_search.Multirun(mode=mode, wall_s=wall_s, concurrency=1, rows=rows, parents=1, trials=trials)


def test_each_multirun_and_each_comparison_prints_its_line(monkeypatch, capsys):
    made = {
        "grid": _multirun("grid", [_trial("optim.lr=0.01", 2.5, 1000), _trial("optim.lr=0.001", 2.7, 1000)],
                          gangs=["fresh: no warm gang of its shape (gang 1)", "warm #2 on gang 1"], wall_s=40.0),
        "study": _multirun("study", [_trial("optim.lr=0.02", 2.4, 1000), _trial("optim.lr=0.005", 2.6, 1000)],
                           gangs=["fresh: no warm gang of its shape (gang 1)", "warm #2 on gang 1"], wall_s=30.0),
        # the pruned study stopped its second trial early: half the tokens, the same winner
        "pruned": _multirun("pruned", [_trial("optim.lr=0.02", 2.4, 1000), _trial("optim.lr=0.005", 3.0, 0)],
                            gangs=["fresh: no warm gang of its shape (gang 1)", "warm #2 on gang 1"], wall_s=25.0),
    }
    asked = []

    def fake_run(mode, args, *, root, env):
        asked.append((mode, args))
        return made[mode]

    monkeypatch.setattr(study_search, "_run", fake_run)
    study_search.main(["--trials", "2", "--concurrency", "1", "--choice", "optim.warmup_steps=0,5"])
    out = capsys.readouterr().out
    assert [m for m, _ in asked] == ["grid", "study", "pruned"]
    assert "hydra.launcher.prune=median" in asked[2][1] and "hydra/sweeper=optuna" in asked[2][1]
    ratios = dict(re.findall(r"^ratio \((grid|study|pruned)\): (\d+\.\d{3})$", out, flags=re.M))
    assert ratios == {"grid": "2.000", "study": "1.500", "pruned": "1.250"}, out  # wall / (training / concurrency)
    assert re.search(r"^study: 2 trials, 1 parent run\(s\), 1 gangs started, concurrency 1", out, flags=re.M), out
    assert "study vs grid: best val loss 2.4000 vs 2.5000 (same or better)" in out, out
    assert re.search(r"^pruned vs unpruned study: compute saved 50\.0% \(1,000 vs 2,000 tokens\), best val loss "
                     r"2\.4000 vs 2\.4000 \(the same configuration: optim\.lr=0\.02 vs optim\.lr=0\.02\)", out,
                     flags=re.M), out
