"""The reaper ends the processes of its own Ray session and no other: a process that names the
session folder, or a Ray process that holds a file open in it, is the session's; one of a session
whose name merely starts the same is not, nor a user's program reading one of its logs."""

from __future__ import annotations

import subprocess
import sys
import time

from trainlab.launch.ray_reaper import reap, session_processes


def _sleeper(*args: str, ray: bool = True) -> subprocess.Popen:
    """A process holding the file args[0] open; `ray`: named as Ray names its workers (ray::IDLE)."""
    code = "import sys, time; f = open(sys.argv[1], 'a'); time.sleep(600)"
    if not ray:
        return subprocess.Popen([sys.executable, "-c", code, *args])
    return subprocess.Popen(["bash", "-c", 'exec -a ray::IDLE "$0" "$@"', sys.executable, "-c", code, *args])


def test_only_the_sessions_own_processes_are_reaped(tmp_path):
    mine, other = tmp_path / "session_1", tmp_path / "session_12"  # 'session_1' starts 'session_12'
    for d in (mine, other):
        (d / "logs").mkdir(parents=True)
    holds_a_log = _sleeper(str(mine / "logs" / "agent.log"))
    names_it = _sleeper(str(tmp_path / "x.log"), f"--log_dir={mine}/logs")
    elsewhere = _sleeper(str(other / "logs" / "agent.log"), f"--log_dir={other}/logs")
    reader = _sleeper(str(mine / "logs" / "agent.log"), ray=False)  # a user's `tail -f` of one of its logs
    try:
        deadline = time.monotonic() + 60
        while {p.pid for p in session_processes(str(mine))} != {holds_a_log.pid, names_it.pid}:
            assert time.monotonic() < deadline, [p.pid for p in session_processes(str(mine))]
            time.sleep(0.1)
        assert reap(str(mine)) == 2
        holds_a_log.wait(timeout=10)  # ended (reap collected their exit status itself)
        names_it.wait(timeout=10)
        assert elsewhere.poll() is None and reader.poll() is None and session_processes(str(mine)) == []
    finally:
        for p in (holds_a_log, names_it, elsewhere, reader):
            p.kill()
            p.wait()
