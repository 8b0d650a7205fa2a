"""Checks of what a sweep leaves for a reader, shared by the tests that run a real sweep: the
parent run's result in MLflow (REST) and report.html as headless Chromium shows it.

Expected values come from compare's summary.csv (its verdicts and numbers), picked here in plain
Python: the fastest row whose verdict is ok."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from trainlab import names


def fastest_ok(rows: dict[str, dict]) -> dict | None:
    """The summary.csv row with verdict ok and the highest speedup; None when none is ok."""
    ok = [r for r in rows.values() if r["verdict"] == "ok"]
    return max(ok, key=lambda r: float(r["speedup"])) if ok else None


def _parent_over_rest(uri: str, parent_id: str) -> tuple[dict, dict]:
    url = f"{uri}/api/2.0/mlflow/runs/get?run_id={parent_id}"
    with urllib.request.urlopen(url, timeout=10) as r:
        run = json.loads(r.read())["run"]
    metrics = {m["key"]: m["value"] for m in run["data"].get("metrics", [])}
    tags = {t["key"]: t["value"] for t in run["data"].get("tags", [])}
    return metrics, tags


def check_parent_result(uri: str, parent_id: str, *, rows: dict[str, dict], answer_line: str,
                        n_trials: int) -> None:
    """The parent's row in MLflow's runs table says what won: the fastest ok configuration as a
    tag, its val loss and speedup and the trials per status as metrics, the same as compare."""
    metrics, tags = _parent_over_rest(uri, parent_id)
    best = fastest_ok(rows)
    assert tags[names.TAG_SWEEP_RESULT] == answer_line
    assert tags[names.TAG_BEST_CONFIG] == (best["label"] if best else "none")
    if best:
        assert metrics[names.BEST_SPEEDUP] == pytest.approx(float(best["speedup"]), rel=1e-9)
        assert metrics[names.BEST_VAL_LOSS] == pytest.approx(float(best["final_val_loss_mean"]), rel=1e-9)
        assert metrics[names.BEST_DELTA_VAL_LOSS] == pytest.approx(float(best["delta_val_loss"]), abs=1e-12)
    counts = {s: sum(int(r[f"n_{s}"]) for r in rows.values())
              for s in (names.STATUS_FINISHED, names.STATUS_FAILED, names.STATUS_DIVERGED, names.STATUS_PRUNED)}
    assert sum(counts.values()) == n_trials
    for status, n in counts.items():
        assert metrics[names.trials_metric(status)] == n, (status, metrics)


def check_report_page(browser, report: Path, *, answer_line: str, screenshot: Path) -> None:
    """report.html at 1600x1000: the answer is its first line, the page does not scroll sideways,
    every plot loaded. Leaves a screenshot to look at."""
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    try:
        page.goto(report.as_uri())
        first = page.evaluate("document.body.innerText.trim().split('\\n')[0]")
        assert first == answer_line
        width = page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], f"report.html scrolls sideways at 1600 px: {width}"
        images = page.evaluate("[...document.images].map(i => [i.alt, i.complete && i.naturalWidth])")
        pngs = sorted(p.stem for p in report.parent.glob("*.png"))
        assert sorted(a for a, _ in images) == pngs and all(w > 0 for _, w in images), images
        page.screenshot(path=str(screenshot), full_page=True)
    finally:
        page.close()
