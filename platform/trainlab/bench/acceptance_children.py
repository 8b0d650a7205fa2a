"""The acceptance run's child processes: each under a deadline, in a session of its own (so
a time-out ends torchrun's workers too), its output appended to one log; and a way to run
them as on the GPU machine, where Ray and MLflow are not installed (--without)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # platform/: what children need on sys.path

_BLOCKER = '''import sys
class _Absent:
    """Written by trainlab.bench.acceptance --without: these packages behave as not installed."""
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
    """Runs each part's processes with a deadline, their output appended to one log file."""

    def __init__(self, *, log: Path, env: dict[str, str], deadline: float, cwd: Path):
        self.log, self.env, self.deadline, self.cwd = log, env, deadline, cwd

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, title: str, cmd: list[str], *, cwd: Path | None = None) -> tuple[int | None, str]:
        """(exit code or None when it ran out of time, its output)."""
        timeout = self.left()
        if timeout < 5:
            return None, "not started: the time budget is spent"
        with self.log.open("a") as f:
            f.write(f"\n===== {title}: {' '.join(cmd)}\n")
            f.flush()
            start = f.tell()
            # a session of its own: on time-out the whole tree goes (torchrun's workers too)
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=self.env,
                                    cwd=cwd or self.cwd, start_new_session=True)
            try:
                code: int | None = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
        with self.log.open() as f:
            f.seek(start)
            return code, f.read()


def tail(output: str, n: int = 12) -> str:
    return "\n".join("    " + line for line in output.strip().splitlines()[-n:])


def error_line(output: str) -> str:
    """The worker's exception (torchrun prefixes its lines with [rankN]: and ends with its own
    ChildFailedError, which says nothing of the cause), else the last line."""
    lines = [re.sub(r"^\[rank\d+\]:\s*", "", line).strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b: ", line)
              and "ChildFailedError" not in line]
    return (errors or lines or ["no output"])[-1][:200]
