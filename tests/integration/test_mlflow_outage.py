"""The MLflow server goes away mid-run (SIGKILL): training never waits, metrics are held
(memory, then the spill file) and delivered once when it returns, or imported later with
`trainlab import-spill`; a resumed run logs no step twice. Real server, real writer."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest
from mlflow.tracking import MlflowClient

from conftest import trainlab_cmd
from trainlab import names
from trainlab.tracking.mlflow_tracker import MlflowTracker
from trainlab.tracking.runs import TrialRun, close_trial_run
from trainlab.tracking.spill import Spill

pytestmark = [pytest.mark.slow]

KEYS = (names.LOSS, names.LR)
BLOCKING_S = 0.5
"""A log_metrics call slower than this waited on something: appending to a list takes
microseconds, an outage lasts the server's restart (tens of seconds here)."""


def _new_run(uri: str) -> str:
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("outage")
    exp_id = exp.experiment_id if exp else client.create_experiment("outage")
    return client.create_run(exp_id).info.run_id


def _steps(uri: str, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, key))


class SteadyLogger(threading.Thread):
    """Logs every key at steps 1, 2, ... every `every_s` until stopped, as training does;
    records how long each log_metrics call took."""

    def __init__(self, tracker: MlflowTracker, *, every_s: float = 0.02):
        super().__init__(daemon=True)
        self.tracker, self.every_s = tracker, every_s
        self.step, self.durations = 0, []
        self.halt = threading.Event()
        self.logged = threading.Condition()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                t0 = time.perf_counter()
                self.tracker.log_metrics({k: float(self.step + 1) for k in KEYS}, step=self.step + 1)
                self.durations.append(time.perf_counter() - t0)
                with self.logged:
                    self.step += 1
                    self.logged.notify_all()
                self.halt.wait(self.every_s)  # the pace of training steps, not a synchronisation
        except BaseException as e:  # noqa: BLE001 - shown by until()
            self.error = e
            raise
        finally:
            with self.logged:
                self.logged.notify_all()

    def until(self, step: int, *, timeout: float = 120) -> None:
        """Wait until `step` is logged; fail with what happened if it is not within `timeout` s."""
        with self.logged:
            reached = self.logged.wait_for(lambda: self.step >= step or self.error is not None, timeout=timeout)
        assert self.step >= step, (f"the logger reached step {self.step}, not {step}, within {timeout} s "
                                   f"(alive: {self.is_alive()}, error: {self.error!r}, timed out: {not reached})")


def test_server_killed_and_restarted_mid_run_loses_and_doubles_nothing(mlflow_server, tmp_path, capfd):
    uri, run_id = mlflow_server.uri, _new_run(mlflow_server.uri)
    spill = tmp_path / names.SPILL_FILE
    tracker = MlflowTracker(run_id=run_id, tracking_uri=uri, flush_every_s=0.1, spill_path=str(spill),
                            outage_buffer=40, close_timeout_s=60)
    logger = SteadyLogger(tracker)
    logger.start()
    logger.until(20)
    mlflow_server.kill()
    killed_at = logger.step
    deadline = time.monotonic() + 30  # the writer process may still be starting
    while not spill.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert spill.exists(), "past outage_buffer points, held metrics go to the spill file"
    mlflow_server.start()
    restarted_at = logger.step
    logger.until(restarted_at + 20)
    logger.halt.set()
    logger.join()
    tracker.close()

    last = logger.step
    assert killed_at < restarted_at < last
    for key in KEYS:
        assert _steps(uri, run_id, key) == list(range(1, last + 1)), key  # each step exactly once
    assert max(logger.durations) < BLOCKING_S, "log_metrics waited on the unreachable server"
    assert not spill.exists(), "everything was delivered, so the spill file is gone"
    err = capfd.readouterr().err
    assert err.count("unreachable") == 1 and err.count("answers again") == 1, err[-3000:]


def test_server_never_returns_then_import_spill_delivers_once(mlflow_server, tmp_path, cli_env):
    uri, run_id = mlflow_server.uri, _new_run(mlflow_server.uri)
    spill = tmp_path / names.SPILL_FILE
    close_timeout_s = 2.0
    tracker = MlflowTracker(run_id=run_id, tracking_uri=uri, flush_every_s=0.1, spill_path=str(spill),
                            outage_buffer=10_000, close_timeout_s=close_timeout_s)
    for step in range(1, 11):
        tracker.log_metrics({k: float(step) for k in KEYS}, step=step)
    deadline = time.monotonic() + 60  # delivered while the server is up (a flush every 0.1 s)
    while any(_steps(uri, run_id, key) != list(range(1, 11)) for key in KEYS):
        assert time.monotonic() < deadline, f"steps 1-10 not on the server within 60 s: {_steps(uri, run_id, KEYS[0])}"
        time.sleep(0.1)
    mlflow_server.kill()
    for step in range(11, 61):
        tracker.log_metrics({k: float(step) for k in KEYS}, step=step)
    t0 = time.monotonic()
    tracker.close()
    took = time.monotonic() - t0
    assert took < close_timeout_s + 5, f"close took {took:.1f} s with close_timeout_s={close_timeout_s}"
    # the driver's close cannot reach the server either: the status goes to the same file
    close_trial_run(TrialRun(run_id, "", uri), status=names.STATUS_FINISHED, spill=str(spill))
    records, held = Spill(str(spill)).check()
    assert held >= 50 * len(KEYS) and records > 0

    mlflow_server.start()
    imported = subprocess.run(trainlab_cmd("import-spill", str(spill)), env=cli_env, capture_output=True,
                              text=True, timeout=120)
    assert imported.returncode == 0, imported.stderr[-3000:]
    client = MlflowClient(tracking_uri=uri)
    for key in KEYS:
        assert _steps(uri, run_id, key) == list(range(1, 61)), key
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags[names.TAG_STATUS] == names.STATUS_FINISHED

    again = subprocess.run(trainlab_cmd("import-spill", str(spill)), env=cli_env, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0 and "nothing to import" in again.stdout, again.stdout + again.stderr
    for key in KEYS:
        assert _steps(uri, run_id, key) == list(range(1, 61)), key


def test_resumed_run_drops_steps_it_already_has(mlflow_server, tmp_path):
    uri, run_id = mlflow_server.uri, _new_run(mlflow_server.uri)
    first = MlflowTracker(run_id=run_id, tracking_uri=uri, flush_every_s=0.1)
    for step in range(1, 11):
        first.log_metrics({k: float(step) for k in KEYS}, step=step)
    first.close()
    # resumed from a checkpoint at step 6: steps 7-10 are replayed (other values), then 11-15
    resumed = MlflowTracker(run_id=run_id, tracking_uri=uri, flush_every_s=0.1, resume=True,
                            spill_path=str(tmp_path / names.SPILL_FILE))
    for step in range(7, 16):
        resumed.log_metrics({k: step + 0.5 for k in KEYS}, step=step)
    resumed.close()
    history = MlflowClient(tracking_uri=uri).get_metric_history(run_id, names.LOSS)
    by_step = {m.step: m.value for m in history}
    assert sorted(m.step for m in history) == list(range(1, 16))
    assert by_step[10] == 10.0 and by_step[11] == 11.5  # the replay did not overwrite, the rest landed


@pytest.mark.parametrize("content", [None, "not json\n", '{"trainlab_spill": 1, "id": "x"}\n{"op": 1}\n'])
def test_import_spill_refuses_a_missing_or_malformed_file(tmp_path, cli_env, content):
    path = tmp_path / names.SPILL_FILE
    if content is not None:
        path.write_text(content)
    proc = subprocess.run(trainlab_cmd("import-spill", str(path)), env=cli_env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert str(path) in proc.stderr
