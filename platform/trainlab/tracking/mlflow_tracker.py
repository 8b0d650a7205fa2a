"""Rank 0's MLflow tracker: the training process only appends to a list.

A background thread sends what accumulated every `flush_every_s` as one JSON line to a
writer process (trainlab.tracking.mlflow_writer), which makes the MLflow calls. A store
write costs ~0.4 ms of CPU per metric on sqlite; done in the training process it would take
the core (and the GIL) from training. If the writer dies, training goes on and a warning
says metrics are no longer recorded.

The writer yields the CPU to training once MLflow is imported (mlflow_writer.WRITER_NICE).

The writer reads its stdin whatever the tracking server does, so an outage never blocks or
slows training: it holds the metrics (memory, then `spill_path`) and delivers them when the
server answers again; see trainlab.tracking.outbox.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import warnings
from typing import Any

STUCK_AFTER_S = 30.0
"""At close, past its deadline, a writer that used no CPU for this long is stopped."""


class MlflowTracker:
    """Logs into the existing MLflow run `run_id` at `tracking_uri`.

    spill_path: the file where metrics, tags and artifacts wait while the server is
        unreachable, past `outage_buffer` points held in memory (a trial's
        `<output_dir>/mlflow_spill.jsonl`); None = memory only, and what is still held when
        `close_timeout_s` ran out is lost. Delivered later with `trainlab import-spill PATH`.
    resume: the run already has metrics (a trial resumed from a checkpoint into the same run
        replays the steps after it): per key, points at or below the last step the run has
        are dropped, so the replay logs no step twice.
    close_timeout_s: how long close() waits for an unreachable server before leaving the
        rest in the spill file.
    """

    def __init__(self, *, run_id: str, tracking_uri: str, flush_every_s: float = 2.0,
                 system_metrics: bool = False, spill_path: str | None = None, resume: bool = False,
                 outage_buffer: int = 100_000, close_timeout_s: float = 30.0):
        self.run_id = run_id
        cmd = [sys.executable, "-m", "trainlab.tracking.mlflow_writer", run_id,
               "--outage-buffer", str(outage_buffer), "--close-timeout-s", str(close_timeout_s)]
        if system_metrics:
            cmd.append("--system-metrics")
        if spill_path:
            cmd += ["--spill", str(spill_path)]
        if resume:
            cmd.append("--resume")
        self._close_timeout_s = close_timeout_s
        # the store in the environment, as MLflow reads it, not on the command line: anyone on the
        # machine can read a process's argv (ps), and a database URI holds its password
        env = {"MLFLOW_TRACKING_URI": tracking_uri}
        self._proc = _take_spare(argv=cmd[3:], env={**env, **_mlflow_env()})
        if self._proc is None:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                          env={**os.environ, **env})
        self._sync_id = self._synced = 0  # the last sync asked for / answered by the writer
        self._sync_cond = threading.Condition()
        threading.Thread(target=self._read_acks, name="mlflow-acks", daemon=True).start()
        self._pending: list[list] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._broken = False
        self._flush_every_s = flush_every_s
        self._thread = threading.Thread(target=self._loop, name="mlflow-flush", daemon=True)
        self._thread.start()

    # -- Tracker protocol ------------------------------------------------------------------
    def log_metrics(self, metrics: dict[str, float], *, step: int) -> None:
        ts = int(time.time() * 1000)
        with self._lock:
            self._pending.extend([k, float(v), ts, step] for k, v in metrics.items())

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._send({"op": "tags", "tags": {k: str(v)[:5000] for k, v in tags.items()}})

    def log_artifact(self, path: str) -> None:
        self._send({"op": "artifact", "path": str(path)})

    def close(self) -> None:
        """Flush everything and wait for the writer to finish: metrics are in the store after,
        or, with the server unreachable for `close_timeout_s`, in the spill file."""
        self._stop.set()
        self._thread.join()
        self.flush()
        if self._proc.stdin and not self._proc.stdin.closed:
            try:
                self._proc.stdin.close()
            except BrokenPipeError:
                pass
        # the writer's own deadline, plus one HTTP timeout and its last writes; past it a writer
        # that still uses CPU is working, only slowly (its low priority on a busy machine), and
        # is waited for; one that does not is stuck
        timeout, cpu = self._close_timeout_s + 60, _cpu_s(self._proc.pid)
        while True:
            try:
                self._proc.wait(timeout=timeout)
                return
            except subprocess.TimeoutExpired:
                now = _cpu_s(self._proc.pid)
                if now <= cpu:
                    break
                timeout, cpu = STUCK_AFTER_S, now
        self._proc.kill()
        warnings.warn(f"the MLflow writer for run {self.run_id} did not finish within "
                      f"{self._close_timeout_s + 60:g} s and used no CPU for {timeout:g} s; it was stopped",
                      stacklevel=2)

    def sync(self, timeout_s: float = 60.0) -> bool:
        """Block until everything logged so far is in the store or in the spill file (on disk),
        so a checkpoint taken next never outlives metrics a crash would lose. During an outage
        the writer spills at once: this waits on a disk write, not on the server."""
        self.flush()
        with self._sync_cond:
            self._sync_id += 1
            want = self._sync_id
        self._send({"op": "sync", "id": want})
        with self._sync_cond:
            done = self._sync_cond.wait_for(lambda: self._synced >= want or self._broken, timeout=timeout_s)
        if not done:
            warnings.warn(f"the MLflow writer for run {self.run_id} did not confirm its metrics within "
                          f"{timeout_s:g} s; a crash now may lose the latest ones", stacklevel=2)
        return done and not self._broken

    def _read_acks(self) -> None:
        from trainlab.tracking.mlflow_writer import ACK

        for line in self._proc.stdout:
            if line.startswith(ACK):
                with self._sync_cond:
                    self._synced = max(self._synced, int(line.split()[1]))
                    self._sync_cond.notify_all()
            else:  # whatever else the writer prints goes where it would have gone
                sys.stdout.write(line)
        with self._sync_cond:  # the writer exited: nobody will answer
            self._broken = True
            self._sync_cond.notify_all()

    # -- batching --------------------------------------------------------------------------
    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        if pending:
            self._send({"op": "metrics", "items": pending})

    def _send(self, msg: dict) -> None:
        if self._broken:
            return
        try:
            self._proc.stdin.write(json.dumps(msg) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            self._broken = True
            warnings.warn(f"the MLflow writer for run {self.run_id} exited "
                          f"(code {self._proc.poll()}); training goes on without tracking", stacklevel=2)

    def _loop(self) -> None:
        while not self._stop.wait(self._flush_every_s):
            self.flush()


# -- a writer started before its run exists (warm gangs) -----------------------------------
_spare: subprocess.Popen | None = None


def prestart_writer(*, tracking_uri: str) -> None:
    """Start a writer that imports MLflow and opens `tracking_uri`'s store now, and waits for
    its run: the next MlflowTracker of this process takes it, so that its start (~2-3 s of CPU)
    is not waited for at that trial's close. A warm gang's rank 0 starts one while it trains,
    for the trial after."""
    global _spare
    if _spare is None or _spare.poll() is not None:
        _spare = subprocess.Popen([sys.executable, "-m", "trainlab.tracking.mlflow_writer", "--spare"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "MLFLOW_TRACKING_URI": tracking_uri})


def discard_spare_writer() -> None:
    """End the spare writer unused (it exits when its stdin closes before a command line)."""
    global _spare
    spare, _spare = _spare, None
    if spare is not None and spare.poll() is None:
        try:
            spare.stdin.close()
            spare.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            spare.kill()


def _take_spare(*, argv: list[str], env: dict[str, str]) -> subprocess.Popen | None:
    """The spare writer, handed its command line and the store's environment over its stdin
    (never its argv: ps shows argv); None if there is none, or it died."""
    global _spare
    spare, _spare = _spare, None
    if spare is None or spare.poll() is not None:
        return None
    try:
        spare.stdin.write(json.dumps({"argv": argv, "env": env}) + "\n")
        spare.stdin.flush()
    except (BrokenPipeError, OSError, ValueError):
        return None
    return spare


def _mlflow_env() -> dict[str, str]:
    """MLflow's variables of this process (the server's credentials among them), which a spare
    writer started before they were set lacks."""
    return {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_")}


def _cpu_s(pid: int) -> float:
    """CPU seconds process `pid` has used so far (0 once it is gone)."""
    import psutil

    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return times.user + times.system
