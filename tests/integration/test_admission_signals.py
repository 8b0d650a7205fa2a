"""Ctrl-C and SIGTERM are answered while a trial is still being admitted: a check that takes long
(here a 64 GiB token file scanned for ids beyond the vocabulary, minutes of reading) stops at the
signal, the command says so in one line and exits 128 + the signal, and no Ray session started.
Before, the driver's handler only set a flag that nobody read until the checks had finished.

The real CLI in a subprocess; the signal is sent once the command has the token file open (its
scan has begun), so the test does not depend on how fast this machine starts Python."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
import pytest

from conftest import trainlab_cmd

DEADLINE_S = 120
"""The command must exit within this of the signal (about 1 s here; the scan alone takes minutes)."""
SCAN_START_S = 300
"""How long the command may take to open the token file (Python, torch and Hydra start first)."""


def _started_scanning(proc: subprocess.Popen, path: str) -> bool:
    try:
        return any(f.path == path for f in psutil.Process(proc.pid).open_files())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


@pytest.mark.parametrize(("signum", "sweep"), [(signal.SIGINT, False), (signal.SIGTERM, True)],
                         ids=["SIGINT-trial", "SIGTERM-sweep"])  # one handler takes every stop signal
def test_a_stop_signal_during_the_checks_ends_the_command_at_once(tmp_path, cli_env, signum, sweep):
    big = tmp_path / "huge.bin"
    with open(big, "wb") as f:
        f.truncate(64 << 30)  # sparse: no disk, but every byte is read by the id scan
    env = {**cli_env, "RAY_TMPDIR": str(tmp_path / "ray")}
    args = ["train", *(["-m", "seed=0,1"] if sweep else []), "model=tiny", "data=tokens", f"data.path={big}",
            "data.vocab_size=100", "tracking=none", "cluster.num_workers=1", "train.max_steps=2"]
    # SIGINT at its default, as a shell in a terminal starts a command (a background job ignores it)
    proc = subprocess.Popen(trainlab_cmd(*args), cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + SCAN_START_S
        while not _started_scanning(proc, str(big)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"the command did not open {big} in {SCAN_START_S} s"
            time.sleep(0.2)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    shown = f"--- stdout\n{out[-2000:]}\n--- stderr\n{err[-3000:]}"
    assert proc.returncode == 128 + signum, shown
    assert f"interrupted by {signal.Signals(signum).name} before training started" in err, shown
    assert "Traceback" not in out + err, shown
    assert not (tmp_path / "ray").exists() or not os.listdir(tmp_path / "ray"), "a Ray session was started"
