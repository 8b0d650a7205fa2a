"""The stop signals (events.STOP_SIGNALS), in-process and without Ray: the terminal closing
(SIGHUP) stops a trial after a checkpoint on the driver and in a worker that can take signals,
as SIGINT and SIGTERM do; a signal ignored when the command started (nohup) stays ignored; and
what the command says after a second Ctrl-C is what really happened. The real CLI's side (a
Ray cluster, MLflow, checkpoints) is tests/integration/test_interrupt.py's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import psutil
import pytest

from trainlab import cli, names
from trainlab.config.checkpoints import META_FILE, step_dir
from trainlab.engine.preemption import PREEMPT, Preemption
from trainlab.events import STOP_SIGNALS
from trainlab.launch import interrupt


@pytest.fixture(autouse=True)
def fresh_interrupt(monkeypatch):
    """No interrupt of an earlier test; every stop signal's handler put back afterwards."""
    monkeypatch.setattr(interrupt, "_active", None)
    monkeypatch.setattr(interrupt, "_last", None, raising=False)
    monkeypatch.setattr(interrupt, "_entered", False)
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    for s, handler in before.items():  # as from a terminal: pytest under nohup inherits SIGHUP ignored,
        if handler == signal.SIG_IGN:  # which the driver keeps ignored (its own test below)
            signal.signal(s, signal.SIG_DFL)
    yield
    for s, handler in before.items():
        signal.signal(s, handler)


def test_the_terminal_closing_is_a_stop_signal_like_ctrl_c_and_sigterm():
    assert set(STOP_SIGNALS) == {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_the_driver_takes_each_stop_signal_and_goes_on_to_stop_its_trials(sig):
    with interrupt.interruptible() as it:
        # checked before sending: without the driver's handler the signal would end pytest itself
        assert signal.getsignal(sig) == it._on_signal, f"{sig.name} is not the driver's to handle"
        os.kill(os.getpid(), sig)
        time.sleep(0.01)  # Python runs the handler between bytecodes of the main thread
        assert it.signum == sig and not it.forced
        os.kill(os.getpid(), sig)
        time.sleep(0.01)
        assert it.forced  # the same signal again: stop at once
    assert signal.getsignal(sig) != it._on_signal  # given back once the trials ended


def test_a_signal_ignored_when_the_command_started_stays_ignored():
    """`nohup trainlab train ...`: closing the terminal must not stop the run."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with interrupt.interruptible():
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    preemption = Preemption()
    try:
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        preemption.close()


def test_a_worker_stops_after_its_step_on_sighup_and_at_once_on_a_second():
    """A torchrun rank (its loop in the main thread) whose terminal closed: the first SIGHUP asks
    for a checkpoint and a stop after the step; the second runs the handler from before."""
    seen: list[int] = []
    signal.signal(signal.SIGHUP, lambda signum, _frame: seen.append(signum))
    preemption = Preemption()
    try:
        assert preemption.requested() == ""
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.01)
        assert preemption.requested() == PREEMPT and preemption.signum == signal.SIGHUP and seen == []
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.01)
        assert seen == [signal.SIGHUP]  # stopped at once: what SIGHUP did before the trainer
    finally:
        preemption.close()


def test_a_second_ctrl_c_while_the_command_ends_says_the_trials_were_stopped(monkeypatch, capsys):
    """Ctrl-C stopped the trials; Ctrl-C again as the command ends (after the handlers were
    given back) is Python's KeyboardInterrupt: the line must not claim training never started."""
    def trained_then_interrupted_again() -> None:
        with interrupt.interruptible():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
        raise KeyboardInterrupt

    monkeypatch.setattr("trainlab.train.main", trained_then_interrupted_again)
    monkeypatch.setattr(interrupt, "release_cluster", lambda: None)
    with pytest.raises(SystemExit) as ended:
        cli._train("train", [])
    err = capsys.readouterr().err
    assert ended.value.code == 130
    assert "before training started" not in err, err
    assert "already stopped" in err and "run the same command to resume" in err, err


@pytest.mark.parametrize("after_trials", [False, True], ids=["composing", "ending"])
def test_sigterm_outside_the_trials_handlers_ends_the_command_in_its_line(monkeypatch, capsys, after_trials):
    """SIGTERM while Hydra composes (before any trial took the signals) or after the trials gave
    them back: one line and exit 143, where the default handler ended the command without one."""
    def composing() -> None:
        if after_trials:
            with interrupt.interruptible():
                pass
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        raise AssertionError("SIGTERM did not stop the command")

    monkeypatch.setattr("trainlab.train.main", composing)
    monkeypatch.setattr(interrupt, "release_cluster", lambda: None)
    # at its default, as a command starts: this test process may hold an earlier test's handler (Ray's,
    # trainlab's) under pytest-xdist, which the command would keep (the fixture puts it back after)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with pytest.raises(SystemExit) as ended:
        cli._train("train", [])
    assert ended.value.code == 143
    said = "while the command ended" if after_trials else "before training started"
    assert f"interrupted by SIGTERM {said}" in capsys.readouterr().err


def test_sigterm_ignored_when_the_command_started_stays_ignored_while_it_composes(monkeypatch):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    monkeypatch.setattr("trainlab.train.main", lambda: os.kill(os.getpid(), signal.SIGTERM))
    cli._train("train", [])  # returns: a signal ignored when the command started (nohup) is not its to take
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN


def test_ctrl_c_while_ray_ends_kills_what_is_left_at_once(monkeypatch):
    """release_cluster waits for the command's processes to end; Ctrl-C again while it waits
    kills what is left at once (never a KeyboardInterrupt halfway through)."""
    child = subprocess.Popen(["sleep", "30"])
    monkeypatch.setattr(psutil.Process, "children", lambda self, recursive=False: [psutil.Process(child.pid)])
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(is_initialized=lambda: False))
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    with interrupt.interruptible():
        interrupt.release_cluster()
    assert time.monotonic() - t0 < interrupt.RELEASE_TIMEOUT_S / 2
    assert not psutil.pid_exists(child.pid)  # killed and reaped by release_cluster
    child.wait(timeout=5)


def _trial(tmp_path, idx: int, *, status: str, run_id: str | None, steps: int | None, last_step: int | None,
           ckpts: tuple[int, ...] = ()):
    root = tmp_path / f"t{idx}"
    for step in ckpts:
        step_dir(root, step).mkdir(parents=True)
        (step_dir(root, step) / META_FILE).write_text("{}")
    return SimpleNamespace(idx=idx, label=f"tiny-s{idx}", status=status, run_id=run_id,
                           result=SimpleNamespace(steps=steps) if steps is not None else None,
                           extra={"last_step": last_step}, plan=SimpleNamespace(paths=SimpleNamespace(checkpoint_root=str(root))),
                           run=SimpleNamespace(train=SimpleNamespace(max_steps=100, checkpoint_dir=None)))


def test_an_interrupted_sweep_says_which_trial_was_checkpointed_where_and_how_to_resume(tmp_path):
    trials = [
        _trial(tmp_path, 0, status=names.STATUS_PREEMPTED, run_id="r0", steps=12, last_step=12, ckpts=(10, 12)),
        _trial(tmp_path, 1, status=names.STATUS_PREEMPTED, run_id="r1", steps=None, last_step=9, ckpts=(5,)),
        _trial(tmp_path, 2, status=names.STATUS_PREEMPTED, run_id="r2", steps=None, last_step=0),
        _trial(tmp_path, 3, status=names.STATUS_PREEMPTED, run_id=None, steps=None, last_step=None),  # before its run
        _trial(tmp_path, 4, status="pending", run_id=None, steps=None, last_step=None),
        _trial(tmp_path, 5, status=names.STATUS_FINISHED, run_id="r5", steps=100, last_step=100),
    ]
    head, *each = interrupt.sweep_stopped_lines(trials, signum=signal.SIGINT, forced=True)
    assert head == ("interrupted by SIGINT, then again: stopped at once: 3 trials stopped (runs KILLED), 2 not "
                    "started; run the same command to resume them (finished trials are skipped)")
    assert each == [
        "  #0 tiny-s0: at step 12 of 100; checkpoint of step 12 saved: resumes there",
        "  #1 tiny-s1: after step 9 of 100 (stopped at once); resumes from its checkpoint of step 5",
        "  #2 tiny-s2: before its first step; no checkpoint yet: starts over",
    ], each
    head, *each = interrupt.sweep_stopped_lines(trials[:1], signum=signal.SIGHUP, forced=False)
    assert head.startswith("interrupted by SIGHUP: 1 trials stopped (runs KILLED), 0 not started")
    assert each == ["  #0 tiny-s0: at step 12 of 100; checkpoint of step 12 saved: resumes there"]


def test_a_save_cut_off_by_stopping_at_once_leaves_no_tmp(tmp_path, monkeypatch):
    """Ctrl-C twice: the gang is let go while it may be writing step_N.tmp; once every process
    of the command has ended, that half-written folder goes and the checkpoints stay."""
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(is_initialized=lambda: False))
    monkeypatch.setattr(psutil.Process, "children", lambda self, recursive=False: [])
    root = tmp_path / "checkpoints"
    step_dir(root, 5).mkdir(parents=True)
    (step_dir(root, 5) / META_FILE).write_text("{}")
    (root / "step_00000008.tmp").mkdir()
    with interrupt.interruptible() as it:
        it.cut_off.append(root)  # as launch.lifecycle records a trial let go before its save
        interrupt.release_cluster()
    assert sorted(p.name for p in root.iterdir()) == ["step_00000005"]
