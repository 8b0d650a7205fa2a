"""`trainlab bench overhead` as a user runs it: under --load its MLflow writer yields the CPU
to training, and `kill` (SIGTERM) or Ctrl-C stops it mid-round, leaving no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
import pytest

from conftest import trainlab_cmd
from trainlab.tracking.mlflow_writer import WRITER_NICE

pytestmark = pytest.mark.slow  # ~30 s each: a bench process starting, a warm-up and a first round

# rounds of a few seconds (the tiny model, 30 steps); far more rounds than the test waits for
BENCH = ["bench", "overhead", "--repeats", "50", "--load", "1", "model=tiny", "data=markov",
         "train.max_steps=30", "train.global_batch_size=4", "train.micro_batch_size=4", "train.seq_len=32"]
STOP_WITHIN_S = 30.0
"""The trainer stops at the end of its step and the bench ends its writer and busy processes
(measured on 2 cores that other jobs kept busy: 2 s at load 5, 10-11 s at load 37)."""


def _group(pgid: int) -> list[psutil.Process]:
    """The live processes of a process group (the bench, its writer, its busy processes)."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["kill", "ctrl_c"])
def test_bench_overhead_stops_on_a_signal_and_its_writer_yields_to_training(sig, cli_env, tmp_path):
    proc = subprocess.Popen(trainlab_cmd(*BENCH), cwd=tmp_path, env=cli_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    try:
        for line in proc.stdout:  # round 1 done: round 2's engine loop (and its writer) starts
            lines.append(line)
            if line.startswith("round 1:"):
                break
        assert lines and lines[-1].startswith("round 1:"), "".join(lines)
        bench_nice = psutil.Process(proc.pid).nice()
        writers, deadline = [], time.monotonic() + 60
        while not writers and time.monotonic() < deadline:  # started, and done importing MLflow
            group = _group(proc.pid)
            writers = [p for p in group if "trainlab.tracking.mlflow_writer" in " ".join(p.cmdline())
                       and p.nice() == bench_nice + WRITER_NICE]
            time.sleep(0.05)
        assert writers, "round 2's engine loop starts an MLflow writer that yields to training"
        spinners = [p for p in group if "trainlab.tracking.mlflow_writer" not in " ".join(p.cmdline())
                    and p.pid != proc.pid]
        assert [p.nice() for p in spinners] == [bench_nice]  # --load 1: one, at the bench's priority

        t0 = time.monotonic()
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # Ctrl-C reaches the whole process group
        else:
            proc.send_signal(sig)  # `kill PID` reaches the bench alone
        rest, _ = proc.communicate(timeout=STOP_WITHIN_S)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = "".join(lines) + rest
    assert proc.returncode == 128 + sig, out
    assert took < STOP_WITHIN_S
    print(f"stopped {took:.1f} s after {sig.name}")
    assert f"overhead: stopped by {sig.name}; no ratio" in out
    # stopped mid-run: a busy machine may finish round 2 between the writer's start and the signal
    # (a race on a count of rounds), but never the 50 rounds, nor the ratio of whole ones
    rounds = [line for line in out.splitlines() if line.startswith("round ")]
    assert len(rounds) < 50 and "ratio:" not in out, out
    assert "Traceback" not in out, out  # neither the bench nor its writer died mid-write
    assert _group(proc.pid) == []  # no writer, no busy process left running
