"""The acceptance run's child processes: each under a deadline, in a session of its own (so
a time-out ends torchrun's workers too), its output appended to one log; and a way to run
them as on the GPU machine, where Ray and MLflow are not installed (--without)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # platform/: what children need on sys.path

_BLOCKER = '''import sys
class _Absent:
    """Written by trainlab.bench.acceptance.gpu_accept --without: these packages behave as not installed."""
    names = {names!r}
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {{name!r}} (hidden by --without)", name=name)
        return None
sys.meta_path.insert(0, _Absent())
'''


def without(names: list[str]) -> str:
    """A folder whose sitecustomize hides `names` in every Python that has it on PYTHONPATH
    (children and, once added to sys.path and imported, this one)."""
    folder = tempfile.mkdtemp(prefix="trainlab-without-")
    Path(folder, "sitecustomize.py").write_text(_BLOCKER.format(names=sorted(names)))
    return folder


def child_env(extra_path: list[str]) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([*extra_path, str(PACKAGE_ROOT),
                                         *filter(None, [env.get("PYTHONPATH")])])
    return env


class Children:
    """Runs each part's processes with a deadline, their output appended to one log file as it
    comes (and echoed to this process's stdout where asked), so a run cut from outside still
    leaves every line its children wrote."""

    def __init__(self, *, log: Path, env: dict[str, str], deadline: float, cwd: Path):
        self.log, self.env, self.deadline, self.cwd = log, env, deadline, cwd

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, title: str, cmd: list[str], *, cwd: Path | None = None, echo: bool = False,
            poll: Callable[[], None] | None = None, deadline: float | None = None,
            interrupt_s: float = 0.0) -> tuple[int | None, str]:
        """(exit code or None when it ran out of time, its output). `poll` is called about
        every POLL_S while it runs (and once after). At `deadline` (default: this runner's)
        the process's session gets SIGINT first where `interrupt_s` > 0 (pytest then writes
        its summary and JUnit XML) and SIGKILL `interrupt_s` seconds later."""
        end = min(self.deadline, deadline or self.deadline)
        if end - time.monotonic() < 5:
            return None, "not started: the time budget is spent"
        with self.log.open("a") as f:
            f.write(f"\n===== {title}: {' '.join(cmd)}\n")
            f.flush()
            start = f.tell()
        # a session of its own: on time-out the whole tree goes (torchrun's workers too)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env,
                                cwd=cwd or self.cwd, start_new_session=True)
        copier = threading.Thread(target=_copy, args=(proc.stdout, self.log, echo), daemon=True)
        copier.start()
        code: int | None = None
        signals = [(end, signal.SIGINT), (end + interrupt_s, signal.SIGKILL)] if interrupt_s > 0 \
            else [(end, signal.SIGKILL)]
        timed_out = False
        while True:
            wait = min(POLL_S, max(0.0, signals[0][0] - time.monotonic())) if signals else POLL_S
            try:
                code = proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                pass
            if poll is not None:
                poll()
            if signals and time.monotonic() >= signals[0][0]:
                _, sig = signals.pop(0)
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
        copier.join(timeout=10)
        if poll is not None:
            poll()
        with self.log.open(errors="replace") as f:
            f.seek(start)
            return (None if timed_out else code), f.read()


POLL_S = 1.0
"""How often a running child's progress is read (a table's rows, a deadline)."""


def _copy(stream, log: Path, echo: bool) -> None:
    """A child's output, line by line as it comes, to the log (and stdout)."""
    with log.open("ab") as f:
        for line in iter(stream.readline, b""):
            f.write(line)
            f.flush()
            if echo:
                sys.stdout.write(line.decode(errors="replace"))
                sys.stdout.flush()


def tail(output: str, n: int = 12) -> str:
    return "\n".join("    " + line for line in output.strip().splitlines()[-n:])


def error_line(output: str) -> str:
    """The worker's exception (torchrun prefixes its lines with [rankN]: and ends with its own
    ChildFailedError, which says nothing of the cause), else the last line."""
    lines = [re.sub(r"^\[rank\d+\]:\s*", "", line).strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b: ", line)
              and "ChildFailedError" not in line]
    return (errors or lines or ["no output"])[-1][:200]
