"""`trainlab bench hf`: trainlab and Accelerate's plain loop train the same Hugging Face model side by side.

Through the real command (a fresh process, the demo model written to a temporary folder, nothing
downloaded): it ends with its ratio line, writes the plot, and the two loss curves it prints
agree at every step. In fp32 both start from the same weights and see the same batches with
the same optimizer, so a relative difference above 1e-4 at any step is a bug in one of the two
loops (a shifted label, a missed clip or schedule step, another init), not noise.
"""

from __future__ import annotations

import math
import re
import subprocess

import pytest

from conftest import trainlab_cmd

SMALL = ["--steps", "4", "--repeats", "1", "--seq-len", "32", "--global-batch-size", "4",
         "--micro-batch-size", "2"]  # two micro-batches a step: the accumulation path of both loops
ROW = re.compile(r"\s*(\d+)\s+(\d+\.\d{6})\s+(\d+\.\d{6})\s+\S+\s+\S+")


def run_bench(tmp_path, cli_env, *args: str) -> subprocess.CompletedProcess:
    env = {**cli_env, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(trainlab_cmd("bench", "hf", *args), cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)


def loss_curves(stdout: str) -> tuple[list[float], list[float]]:
    """The printed table's trainlab and accelerate loss of every step, in step order."""
    rows = [m for line in stdout.splitlines() if (m := ROW.fullmatch(line))]
    assert [int(m.group(1)) for m in rows] == list(range(1, len(rows) + 1)), stdout
    return [float(m.group(2)) for m in rows], [float(m.group(3)) for m in rows]


@pytest.mark.parametrize("precision,tolerance", [
    pytest.param("fp32", 1e-4, marks=pytest.mark.slow),  # ~11 s in CI: a bench, in the slow tier
    pytest.param("bf16", 2e-2, marks=pytest.mark.slow),
])
def test_bench_hf_prints_a_ratio_and_the_same_loss_curve_for_both_loops(precision, tolerance, tmp_path, cli_env):
    proc = run_bench(tmp_path, cli_env, *SMALL, "--precision", precision, "--plot", "curves.png")
    shown = f"\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, shown
    assert "Traceback" not in proc.stdout + proc.stderr, shown
    m = re.fullmatch(r"ratio: (\d+\.\d{3})", proc.stdout.rstrip().splitlines()[-1])
    assert m, f"the last line is not `ratio: X.XXX`{shown}"
    assert math.isfinite(float(m.group(1))) and float(m.group(1)) > 0, shown

    ours, peer = loss_curves(proc.stdout)
    assert len(ours) == 4, shown  # one row per optimizer step
    assert ours[-1] < ours[0], f"the loss did not fall: {ours}{shown}"  # it trained, not a constant
    for step, (a, b) in enumerate(zip(ours, peer), start=1):
        assert abs(a - b) <= tolerance * abs(b), f"step {step}: trainlab {a} vs accelerate {b}{shown}"
    assert "loss curves: same" in proc.stdout, shown
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args,says", [
    (["--steps", "0"], "--steps=0 must be >= 1"),
    (["--model-dir", "/x", "--demo-layers", "4"], "--demo-hidden/--demo-layers shape the demo model only"),
    (["train.seq_len=64"], "override 'train.seq_len=64' would change trainlab's loop only"),
])
def test_bench_hf_refuses_what_the_two_loops_would_not_share(args, says, capsys):
    from trainlab.bench.hf_peer import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert says in capsys.readouterr().err
