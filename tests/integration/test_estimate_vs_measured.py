"""`trainlab bench estimate --quick`: the real command trains its smoke matrix and judges the estimate.

A fresh process, as a user's: it trains 4 tiny trials on 2 gloo ranks through the real trainer,
estimates each, and must show progress per trial, end with the held-out summary line, and
write the CSV (every trial's per-rank bytes measured beside the estimate's), the plot and the
measurements. State bytes are counted by the estimate, not modelled, so every trial's must be
exact; the peak memory and step time counts are the machine's and are not asserted.
"""

from __future__ import annotations

import csv
import re
import subprocess

import pytest

from conftest import trainlab_cmd

SUMMARY = re.compile(r"held out: state bytes exact: (\d+)/(\d+); peak memory within 15 %: (\d+)/(\d+); "
                     r"step time within 30 %: (\d+)/(\d+)")


@pytest.mark.slow  # a fresh process, 2 spawned ranks, 4 trials: ~20-40 s on 2 busy cores
def test_quick_bench_trains_estimates_and_writes_its_table_csv_and_plot(cli_env, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(trainlab_cmd("bench", "estimate", "--quick", "--out", str(out)), cwd=tmp_path,
                          env={**cli_env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    shown = f"\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, shown
    assert "Traceback" not in proc.stdout + proc.stderr, shown
    lines = proc.stdout.rstrip().splitlines()
    progress = [line for line in lines if re.match(r"\[\s*\d+/4\] ", line)]
    assert len(progress) == 4 and all(": finished (" in line for line in progress), shown

    m = SUMMARY.fullmatch(lines[-1])
    assert m, f"the last line is not the held-out summary: {lines[-1]!r}{shown}"
    exact, trials = int(m.group(1)), int(m.group(2))
    assert trials == 4, shown  # every trial ran and was estimated
    assert exact == trials, f"counted state bytes differ from the trainer's:{shown}"

    rows = list(csv.DictReader((out / "estimate_bench.csv").open()))
    assert [r["status"] for r in rows] == ["finished"] * 4
    for r in rows:
        for kind in ("params", "grads", "optim_state"):
            measured = [int(v) for v in r[f"meas_{kind}_b"].split(";")]
            assert len(measured) == 2 and all(v > 0 for v in measured), r  # one count per rank
            assert r[f"est_{kind}_b"] == r[f"meas_{kind}_b"], (r["trial"], kind)
        assert float(r["meas_step_s"]) > 0 and float(r["est_step_s_held_out"]) > 0, r
        assert all(float(v) > 0 for v in r["meas_peak_gb"].split(";")), r
    assert (out / "estimate_bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the measurements re-estimate without training: the same trials, the same counted bytes
    again = subprocess.run(trainlab_cmd("bench", "estimate", "--measured", str(out / "estimate_bench_measured.json"),
                                        "--out", str(tmp_path / "again")),
                           cwd=tmp_path, env=cli_env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.rstrip().splitlines()[-1].startswith(f"held out: state bytes exact: {exact}/4;"), again.stdout
    assert "[  1/4]" not in again.stdout  # nothing trained
