"""Nothing of a local Ray cluster outlives the driver that started it, SIGKILL included.

A driver that ends normally (or by a signal it handles) shuts its local cluster down, and Ray's
own fate-sharing ends most of it when the driver is killed: the GCS, the raylet and the workers
go within seconds. Not the raylet's agents (ray::DashboardAgent, ray::RuntimeEnvAgent): they see
their raylet die, then try to report it to the dead GCS with a 60 s timeout (Ray 2.60,
publish_error_to_driver) and linger that long. So the driver that starts a local cluster also
starts this reaper, in a session of its own, reading a pipe whose other end only the driver holds:

    start_reaper(session_dir)     # launch.ray_trial.start_local_cluster, once the cluster is up

The pipe reads end-of-file when the driver is gone, however it ended (or, at a normal exit, as
Python frees its objects: the reaper then waits until the driver's process has ended); where the
cluster shut down as it should, the reaper ends with it; otherwise it gives Ray's own fate-sharing GRACE_S and ends
(SIGKILL) every process of this user that still has a file open in the cluster's session folder
or names it on its command line. It never touches another session:
a Ray cluster is one session folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

GRACE_S = 3.0
"""After the driver is gone: how long Ray's own shutdown (atexit, fate-sharing) has before the reaper acts."""


_STARTED: list[subprocess.Popen] = []
"""The reapers this process started: held for its life (a collected Popen would close the pipe)."""


def start_reaper(session_dir: str) -> subprocess.Popen | None:
    """The reaper of the local cluster whose session folder is `session_dir` (None: none could start).
    Its stdin is a pipe held open by this process alone (not inherited by Ray's children: CLOEXEC);
    the folder goes through it, so that the reaper's command line names no session of Ray's."""
    try:
        reaper = subprocess.Popen([sys.executable, "-m", "trainlab.launch.ray_reaper"],
                                  stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)  # a Ctrl-C to the command's group is not its
        reaper.stdin.write(f"{os.getpid()}\t{os.path.realpath(session_dir)}\n".encode())
        reaper.stdin.flush()
    except OSError:
        return None
    _STARTED.append(reaper)
    return reaper


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + os.sep)


def is_ray_process(cmdline: list[str]) -> bool:
    """A process of Ray's own: its renamed workers and agents (ray::..., ray-dashboard-...) or a
    program of the ray package; never a user's `tail -f` of one of the session's logs."""
    head = cmdline[0] if cmdline else ""
    return head.startswith(("ray::", "ray-dashboard-")) or any(f"{os.sep}ray{os.sep}" in a for a in cmdline[:3])


def session_processes(session_dir: str) -> list:
    """This user's processes of Ray's that belong to the session `session_dir` (psutil.Process): naming
    it on their command line (the GCS, the raylet, the dashboard) or holding a file open in it."""
    import psutil

    me, uid, found = os.getpid(), os.getuid(), []
    for proc in psutil.process_iter(["uids", "cmdline", "status"]):
        try:
            if proc.pid == me or proc.info["uids"].real != uid or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmdline = proc.info["cmdline"] or []
            if not is_ray_process(cmdline):
                continue
            named = (arg.rpartition("=")[2] for arg in cmdline)  # --log_dir=PATH
            if any(_inside(p, session_dir) for p in named) or any(_inside(f.path, session_dir)
                                                                  for f in proc.open_files()):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def reap(session_dir: str) -> int:
    """SIGKILL what is left of the session; the number of processes ended."""
    import psutil

    left = session_processes(session_dir)
    for proc in left:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=10)
    return len(left)


def main() -> None:
    pid, _, session_dir = sys.stdin.buffer.readline().decode().strip().partition("\t")
    driver = int(pid) if pid.isdigit() else 0  # the reaper's parent until the driver ends
    while sys.stdin.buffer.read(4096):  # the driver writes nothing more: this returns when it is gone
        pass
    # the pipe may close before the driver has ended (its objects are freed as Python shuts down, and
    # Ray's own shutdown may still run): nothing is judged left over until the driver is gone
    while os.getppid() == driver:
        time.sleep(0.2)
    if not session_dir or not session_processes(session_dir):
        return  # shut down as it should (ray.shutdown at the driver's exit): nothing to do
    time.sleep(GRACE_S)
    reap(session_dir)


if __name__ == "__main__":
    main()
