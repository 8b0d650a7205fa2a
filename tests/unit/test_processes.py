"""Whether a process is gone (vocab.processes), on real processes: the one decision behind a
trial's lease and a run its driver left RUNNING."""

from __future__ import annotations

import os
import subprocess
import sys

from trainlab.vocab.processes import host_name, process_gone, process_id


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_running_process_is_not_gone_and_an_ended_one_is():
    child = _sleeper()
    try:
        me = process_id(child.pid)
        host, pid, start = me.split(" ")
        assert (host, pid) == (host_name(), str(child.pid)) and start.isdigit()
        assert not process_gone(me) and not process_gone(process_id())
        child.kill()
        child.wait()
        assert process_gone(me)
        assert process_gone(f"{host} {pid}")  # an older record, without a start time: by its pid
    finally:
        child.kill()
        child.wait()


def test_a_killed_process_its_parent_has_not_reaped_is_gone():
    child = _sleeper()
    me = process_id(child.pid)
    child.kill()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, still a zombie: the pid stays taken
    try:
        assert process_gone(me)
    finally:
        child.wait()


def test_a_reused_pid_is_gone_and_another_hosts_process_is_unknown():
    host, pid, start = process_id().split(" ")
    assert process_gone(f"{host} {pid} {int(start) - 1000}")  # this pid, but a later process than that one
    assert not process_gone(f"elsewhere.example {pid} {start}")  # another host: nothing here can tell
    assert not process_gone(f"elsewhere.example {pid}")
    for odd in ("", host, f"{host} x 1", f"{host} {pid} soon", f"{host} {pid} {start} extra"):
        assert not process_gone(odd), odd  # not a process id: never called gone
