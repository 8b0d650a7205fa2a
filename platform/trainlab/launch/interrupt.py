"""A stop signal on the driver (events.STOP_SIGNALS: Ctrl-C, SIGTERM, SIGHUP when the terminal
closes): stop the running trials after a checkpoint, end their MLflow runs as KILLED (trial
status `preempted`), leave nothing running.

The first signal asks: each trial's gang saves a checkpoint at the end of its current step
and stops (engine.preemption; the workers run in Ray's threads, which cannot take signals,
so the driver raises a flag in a small actor that rank 0 polls); a gang still waiting for
its workers or building its model has nothing to save and is let go at once. A second
signal, or STOP_GRACE_S without an answer, stops at once: the latest periodic checkpoint is
then where the trial resumes. Either way the same command resumes the trial (launch.lifecycle
finds it by its config hash). The command exits 128 + the signal's number after Ray's
processes it started have ended (release_cluster, still inside the handlers: a signal while
Ray's processes end kills what is left at once, never a traceback nor a wrong message).

The same flag stops one trial for the sweep's pruner (hydra.launcher.prune, launch.pruner): the
pruner calls the trial's StopRequest.stop(reason), the gang loop raises the flag as PRUNE, and
the gang ends the trial after its step as `pruned`, without a checkpoint (engine.preemption).

The handlers are taken before a trial's checks and Ray's start (a signal then ends the
command before any run is opened) and given back when its trials end; before that (Hydra
composing the config) Ctrl-C is Python's KeyboardInterrupt, which the CLI turns into one line
and exit 130.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

from trainlab.config.checkpoints import latest_checkpoint, remove_unfinished_saves, start_over
from trainlab.events import START, STEP, STOP_SIGNALS, ProgressEvent
from trainlab.launch.outcome import TrialOutcome

STOP_GRACE_S = 120.0
"""After the first signal, how long the driver waits for the gangs to save and stop before it
stops them at once (a second signal does that sooner)."""
POLL_S = 0.5
"""How often rank 0 asks the driver's flag whether to stop (one small actor call)."""
RELEASE_TIMEOUT_S = 10.0
"""After Ray's shutdown, how long the driver waits for the processes it started to end
before it kills them."""

class DriverInterrupt:
    """The driver's record of the stop signals: the first sets `signum`, the next `forced`.

    The handler only sets fields (it may run while the main thread is inside Ray or MLflow):
    the loops that wait on the trials read them and act."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.forced = False
        self.count = 0
        """How many stop signals came (release_cluster hurries when one comes while it waits)."""
        self.cut_off: list[Path] = []
        """Checkpoint folders of trials let go before their last save (launch.lifecycle): a
        worker may have been writing step_N.tmp there; release_cluster removes it once every
        process has ended."""
        self._previous: dict[int, object] = {}
        self._announced = threading.Lock()
        self._said = False
        self.admitting = False
        """Inside `admitting`: the trial is being checked and planned, nothing of it started."""

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def _on_signal(self, signum, frame) -> None:
        if signum == getattr(signal, "SIGHUP", None):
            _detach_hung_up_terminal()
        self.count += 1
        if self.signum is None:
            self.signum = signum
        else:
            self.forced = True
        if self.admitting and self.count == 1:
            raise StopBeforeStart(signum)  # nothing to save or end: answered now, not after the checks

    def install(self, *, again: bool = False) -> None:
        """Take the stop signals (main thread only); one ignored when the command started (nohup)
        stays ignored. `again`: after ray.init, set each anew even where Python still names ours:
        Ray's core worker installs a C-level handler (its failure handler: it logs the signal,
        runs ours, then aborts the command, exit -6) that Python's own record never sees."""
        if threading.current_thread() is not threading.main_thread():
            return
        for s in STOP_SIGNALS:
            current = signal.getsignal(s)
            if current == signal.SIG_IGN and s not in self._previous:
                continue
            if current != self._on_signal or again:
                self._previous.setdefault(s, current)
                signal.signal(s, self._on_signal)

    def restore(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for s, previous in self._previous.items():
            signal.signal(s, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()

    def announce(self) -> None:
        """Say once, on the first signal, what happens now."""
        with self._announced:
            if self._said:
                return
            self._said = True
        say(f"{self.name}: stopping each running trial after a checkpoint at its next step (at most "
            f"{STOP_GRACE_S:.0f} s); {self.name} again stops at once")


def say(line: str) -> None:
    """One line on stderr that never fails: after SIGHUP the terminal may be gone (EIO), and
    what the command does next (the checkpoint, the run's end) matters more than the line."""
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def _detach_hung_up_terminal() -> None:
    """SIGHUP: a terminal that closed fails every write with EIO; the command's output goes to
    /dev/null from here on so that saving and ending the runs is never stopped by a print.
    Output to a file or a pipe (nohup, a scheduler's log) is left as it is."""
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            if os.isatty(fd):
                os.dup2(null, fd)
        os.close(null)


_active: DriverInterrupt | None = None
_last: DriverInterrupt | None = None
"""The interrupt of the command's trials once they ended by a signal (after_interrupt)."""
_INERT = DriverInterrupt()  # never signalled: trials run where no handler could be installed


def current() -> DriverInterrupt:
    """The interrupt of the trials running now (an inert one outside `interruptible`)."""
    return _active or _INERT


def handling() -> bool:
    """Whether the driver's handlers take the stop signals now (inside `interruptible`)."""
    return _active is not None


def rearm() -> None:
    """Put the handlers back after something replaced them (ray.init: Ray's core worker's
    C-level handlers, and its Python SIGTERM handler where it set one)."""
    if _active is not None:
        _active.install(again=True)


@contextlib.contextmanager
def interruptible() -> Iterator[DriverInterrupt]:
    """The stop signals as a request to stop the trials run inside (see the module docstring);
    nested uses share the outer one (a sweep's trials). The command's end after a signal
    (its line, release_cluster) belongs inside too: a signal after the handlers are given back
    would be Python's KeyboardInterrupt, or end the command before Ray's processes."""
    global _active, _last, _entered
    if _active is not None:
        yield _active
        return
    _entered = True
    _active = DriverInterrupt()
    _active.install()
    try:
        yield _active
    finally:
        _active.restore()
        if _active.signum:
            _last = _active
        _active = None


class StopBeforeStart(BaseException):
    """A stop signal while a trial was admitted (`admitting`): raised where the driver was, like
    Python's KeyboardInterrupt, so that a check that takes long (a tokenizer, a checkpoint read
    back, a model's arithmetic) does not hold the command; launch.lifecycle ends it with
    before_start's line. A BaseException, as KeyboardInterrupt: no `except Exception` swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def admitting() -> Iterator[None]:
    """While a trial's checks and plan run (before Ray starts or anything of it is written): the
    first stop signal raises StopBeforeStart in the main thread at once. Outside `interruptible`
    (Python's own handlers: KeyboardInterrupt) and in other threads it changes nothing."""
    active = _active
    if active is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    was, active.admitting = active.admitting, True
    try:
        if active.signum:  # a signal came before the checks began
            raise StopBeforeStart(active.signum)
        yield
    finally:
        active.admitting = was


_entered = False
"""Whether the command's trials ever took the stop signals (a signal after they gave them back
comes while the command ends, not before training started)."""


def _raise_stop(signum, frame) -> None:
    raise StopBeforeStart(signum)


def stop_before_start() -> None:
    """From the command's start until its trials take the stop signals (`interruptible`): SIGTERM and
    SIGHUP at their default raise StopBeforeStart where the command is (Hydra composing a sweep's
    jobs, say), as Ctrl-C raises KeyboardInterrupt, so that the command ends in its line
    (stopped_line) instead of dying without one. One ignored when the command started stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s in STOP_SIGNALS:
        if s != signal.SIGINT and signal.getsignal(s) == signal.SIG_DFL:
            signal.signal(s, _raise_stop)


def stopped_line(signum: int) -> str:
    """The line of a command ended by StopBeforeStart outside its trials' handlers."""
    name = signal.Signals(signum).name
    if _last is not None:
        return after_interrupt()
    return f"interrupted by {name} while the command ended" if _entered else f"interrupted by {name} before training started"


def after_interrupt() -> str:
    """The line for a KeyboardInterrupt that reached the command itself (cli): what really
    happened, by whether the command's trials had already been stopped by a signal."""
    if _last is None:
        return "interrupted before training started"
    return (f"interrupted again while ending after {_last.name}: the trials were already stopped "
            "(see above); run the same command to resume them")


# -- one trial's gang -----------------------------------------------------------------------
class StopRequest:
    """The driver's request to stop one running trial early, with why (the sweep's pruner
    calls stop(); the trial's gang loop forwards it to the gang's flag as a PRUNE). Thread-safe:
    the pruner decides in one trial's event thread, the gang loop reads in another."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reason = ""
        """Why the trial was stopped, for its pruned_reason tag ("" until stop())."""

    def stop(self, reason: str) -> None:
        """Ask once; the first reason is the one recorded."""
        with self._lock:
            self.reason = self.reason or reason or "stopped by the sweep"


class GangStop:
    """The driver's side of stopping one trial's gang, checked between progress events: a
    signal on the driver (PREEMPT) or the trial's StopRequest (PRUNE)."""

    def __init__(self, flag, interrupt: DriverInterrupt | None = None, request: StopRequest | None = None,
                 *, ask=None) -> None:
        self.flag = flag
        self._ask = ask or (lambda kind: flag.raise_.remote(kind))
        """ask(kind): ask the gang to stop its trial for PREEMPT or PRUNE (a warm gang's trial is
        asked through its queue)."""
        self.interrupt = interrupt or current()
        self.request = request
        self.training = False
        """The gang reported its start: it has a step's state worth a checkpoint."""
        self.asked_at: float | None = None
        self.pruning = False
        """The request was forwarded to the gang's flag."""
        self.abandoned = False
        """The driver stopped waiting for the gang; Ray's shutdown ends it."""

    def saw(self, event: ProgressEvent) -> None:
        if event.kind in (START, STEP):
            self.training = True

    def give_up(self) -> bool:
        """Whether to stop waiting for the gang now (asking it to stop on the first look)."""
        from trainlab.engine.preemption import PREEMPT, PRUNE

        if self.request is not None and self.request.reason and not self.pruning:
            self.pruning = True  # the gang stops after its step, ends its trial `pruned`, no checkpoint
            self._ask(PRUNE)
        it = self.interrupt
        if it.signum is None:
            return False
        if self.asked_at is None:
            it.announce()
            self.asked_at = time.monotonic()
            self._ask(PREEMPT)
            if not self.training:  # waiting for workers or building: nothing to save
                self.abandoned = True
                return True
        if it.forced or time.monotonic() - self.asked_at > STOP_GRACE_S:
            self.abandoned = True
        return self.abandoned


def follow_stop_flag(flag, ask=None) -> threading.Event:
    """In a worker: poll the driver's flag and stop this process's trainer when it is raised,
    for the flag's reason (engine.preemption: PREEMPT or PRUNE); set the returned event to end
    the polling. `ask()` (instead of flag.get) returns the ObjectRef of the kind: a warm gang's
    trial is asked through its queue."""
    import ray
    from ray.exceptions import GetTimeoutError

    from trainlab.engine.preemption import PREEMPT, stop_from_outside

    done = threading.Event()

    def poll() -> None:
        seen = ""
        while not done.wait(POLL_S):
            try:
                kind = ray.get(ask() if ask else flag.get.remote(), timeout=10 * POLL_S)
            except GetTimeoutError:  # a busy machine: ask again
                continue
            except Exception:  # the driver (and its actor) is gone: Ray ends this worker too
                return
            if kind and kind != seen:  # PRUNE, or PREEMPT (also after a PRUNE: a signal came since)
                seen = kind
                stop_from_outside(kind)
            if kind == PREEMPT:
                return

    threading.Thread(target=poll, name="trainlab-stop-flag", daemon=True).start()
    return done


# -- the end ------------------------------------------------------------------------------
def release_cluster() -> None:
    """Disconnect from Ray and wait until every process this driver started (a local cluster's
    services, its workers, their MLflow writers; none when it joined a cluster) has ended,
    killing what is left after RELEASE_TIMEOUT_S, so nothing outlives the command."""
    import psutil

    started = psutil.Process().children(recursive=True)  # now: a worker's writer is orphaned once it ends
    it = current()
    signals_before = it.count  # a signal from here on (Ctrl-C again while it waits) kills what is left at once
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    alive, deadline = started, time.monotonic() + RELEASE_TIMEOUT_S
    while alive and time.monotonic() < deadline and it.count == signals_before:
        _, alive = psutil.wait_procs(alive, timeout=0.2)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=RELEASE_TIMEOUT_S)
    for root in it.cut_off:  # nobody writes there any more: a save cut off is never complete
        remove_unfinished_saves(root)


def _when(step: int, max_steps: int, *, at_once: bool) -> str:
    if not at_once:
        return f"at step {step} of {max_steps}"
    return f"after step {step} of {max_steps} (stopped at once)" if step else "before its first step"


def say_stopped(run, *, step: int, root, tracked: bool, at_once: bool) -> None:
    """The one line an interrupted trial ends with: where it stopped and how it goes on.
    `at_once`: the gang was let go without its last checkpoint (`step` is the last it reported;
    it may have trained a few more until Ray's shutdown ended it)."""
    ckpt = latest_checkpoint(root)
    again = "run the same command" if tracked else f"add train.resume={root}"
    if ckpt is None:
        how = f"no checkpoint yet: {'the same command' if tracked else 'a rerun'} starts over"
    elif ckpt.step == step and not at_once:
        how = f"checkpoint saved; {again} to resume" + (f" ({start_over(root)} starts over)" if tracked else "")
    else:
        how = f"{again} to resume from its checkpoint of step {ckpt.step}"
    say(f"interrupted by {current().name} {_when(step, run.train.max_steps, at_once=at_once)}: {how}")


def before_start(tracking_uri: str | None, *, show: bool = True):
    """The outcome of a trial interrupted before it opened its run (launch.lifecycle); `show`:
    its own line (a single trial's; a sweep counts it among those not started)."""
    from trainlab import names

    if show:
        say(f"interrupted by {current().name} before training started")
    return TrialOutcome(status=names.STATUS_PREEMPTED, result=None, run_id=None, tracking_uri=tracking_uri,
                        interrupted=current().signum)


def sweep_stopped_lines(trials, *, signum: int, forced: bool, labels: dict[int, str] | None = None) -> list[str]:
    """What an interrupted sweep says at its end (launch.sweep's trials): how many trials were
    stopped and how many never started, then, for each stopped trial, where it stopped and
    where it resumes (its checkpoint: saved at its last step, or an older one when it was
    stopped at once)."""
    from trainlab import names

    stopped = [t for t in trials if t.status == names.STATUS_PREEMPTED and t.run_id]
    waiting = sum(t.status == "pending" or (t.status == names.STATUS_PREEMPTED and not t.run_id) for t in trials)
    how = ", then again: stopped at once" if forced else ""
    lines = [f"interrupted by {signal.Signals(signum).name}{how}: {len(stopped)} trials stopped (runs KILLED), "
             f"{waiting} not started; run the same command to resume them (finished trials are skipped)"]
    for t in stopped:
        at_once = t.result is None
        step = t.result.steps if t.result else t.extra.get("last_step") or 0
        root = t.plan.paths.checkpoint_root if t.plan else t.run.train.checkpoint_dir
        ckpt = latest_checkpoint(Path(root)) if root else None
        if ckpt is None:
            where = "no checkpoint yet: starts over"
        elif ckpt.step == step and not at_once:
            where = f"checkpoint of step {step} saved: resumes there"
        else:
            where = f"resumes from its checkpoint of step {ckpt.step}"
        label = (labels or {}).get(t.idx) or t.label
        lines.append(f"  #{t.idx} {label}: {_when(step, t.run.train.max_steps, at_once=at_once)}; {where}")
    return lines


def say_sweep_stopped(trials, *, signum: int, labels: dict[int, str] | None = None) -> None:
    """The lines an interrupted sweep ends with (sweep_stopped_lines; `labels`: each trial's
    swept values by its index, as the sweep's table names it)."""
    for line in sweep_stopped_lines(trials, signum=signum, forced=current().forced, labels=labels):
        say(line)
