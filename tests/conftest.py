"""Shared fixtures: a session-wide local Ray cluster, composed configs, recording trackers,
a real MLflow tracking server that a test can kill and restart."""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

# Every Ray cluster of these tests listens on loopback. ray.init swaps 127.0.0.1 for the machine's
# routable IP unless multi-node clusters are off when Ray is first imported (ray_constants reads the
# variable then); trainlab sets it just before its own first import (launch.ray_trial.local_node_options),
# too late in a test worker where an earlier test imported Ray: CI's session clusters listened on
# the machine's 192.0.2.2 (2026-12-07). The commands that start multi-node clusters strip RAY_*.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import psutil  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from ray_leftovers import pytest_configure, pytest_sessionfinish  # noqa: F401 - hooks: Ray never outlives the tests
from trainlab.distributed import close_distributed
from trainlab.plan.here import plan_here

REPO = Path(__file__).resolve().parents[1]

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    # A test run started in the background of a shell without job control (`cmd &` in a script)
    # inherits SIGINT ignored (POSIX), and so would every command a test starts, which keeps an
    # ignored stop signal ignored (as after nohup): the tests that press Ctrl-C on a command waited
    # for one that rightly went on (a local CI run of 2026-12-07: 7 failed, and one such command
    # trained on for 25 minutes beside the tier). Python's handler here is reset to the default
    # in every command it execs, as a terminal starts a command.
    signal.signal(signal.SIGINT, signal.default_int_handler)

SLOW_TIMEOUT_S = 1800
"""pytest-timeout's limit for a `slow` test (pyproject's 600 s stays the gate's): a hang guard far
above the typical time. The longest slow tests take 300 s in CI; beside 2 busy processes
(`.ci/load`, 2026-12-07) the warm-gang sweep test passed 600 s and was killed mid-command."""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))


@functools.cache
def torch_import_cpu_s() -> float:
    """CPU seconds a fresh interpreter takes to import torch on this machine: the unit that CPU
    bounds on a command are stated in, so that they hold on a slower machine as on a faster one
    (0.5 s of CPU for a config-layer refusal was 0.38 of it on a machine where the import took
    1.3 s, and 1.24 s, again 0.38 of it, on one 2.3x slower where it took 3.3 s)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "import torch"], check=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_HELD_PORTS: list[socket.socket] = []


def closed_port() -> int:
    """A loopback port nothing listens on: bound, never listening, and held to the end of the
    session, so a connection there is refused and no other process (a parallel test worker's
    server, a gloo rendezvous) can take it meanwhile."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    _HELD_PORTS.append(s)
    return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> None:
    """This spawned process as `rank` of `world` for torch.distributed's env:// rendezvous on
    127.0.0.1:`port`, with one torch thread (several ranks share a 2-core machine)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)


def spawn_ranks(target: Callable, world: int, *args, results: int = 1, timeout: float = 240) -> list:
    """Run ``target(rank, world, port, out, *args)`` in `world` spawned processes and return the
    first `results` items they put on the queue `out`.

    Fails fast, with the exit codes, when a rank dies before reporting, and after the ranks
    are joined when one exited with an error (what was reported is in the message)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=target, args=(rank, world, port, out, *args)) for rank in range(world)]
    for p in procs:
        p.start()
    got, deadline = [], time.monotonic() + timeout
    try:
        while len(got) < results:
            try:
                got.append(out.get(timeout=1))
            except queue.Empty:
                codes = [p.exitcode for p in procs]
                assert all(c in (None, 0) for c in codes), f"a rank died before reporting: exit codes {codes}"
                assert time.monotonic() < deadline, f"no result from {world} ranks within {timeout} s"
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    codes = [p.exitcode for p in procs]
    assert codes == [0] * world, f"exit codes {codes}; reported: {str(got)[:4000]}"
    return got


def gloo_rank(rank: int, world: int, port: int, out, rank_main: Callable[[], dict]) -> None:
    """spawn_ranks' target for a test whose every rank runs `rank_main()` (a module-level function)
    in a gloo process group: puts (rank, its result), or (rank, its traceback) instead of leaving
    the parent to time out."""
    import traceback

    import torch.distributed as dist

    from trainlab.distributed import close_distributed

    rank_env(rank, world, port)
    dist.init_process_group("gloo")
    try:
        out.put((rank, rank_main()))
    except BaseException:
        out.put((rank, traceback.format_exc()))
    finally:
        close_distributed(barrier=False)


def every_rank(rank_main: Callable[[], dict], world: int) -> dict[int, dict]:
    """rank -> what `rank_main()` returned on it, over `world` gloo ranks; fails with a rank's traceback."""
    results = dict(spawn_ranks(gloo_rank, world, rank_main, results=world))
    for rank, result in results.items():
        assert isinstance(result, dict), f"rank {rank} failed:\n{result}"
    return results


def rank0_unless_failed(reports: list) -> dict:
    """From spawn_ranks' `(rank, {case: result})` items of every rank: rank 0's results, where a
    case that raised on any rank (caught there as its traceback, a str, so the other cases still
    run) is that rank's traceback. Keeps a failure of rank 1 from being dropped."""
    by_rank = dict(reports)
    merged = dict(by_rank[0])
    for rank in sorted(by_rank):
        for case, got in by_rank[rank].items():
            if isinstance(got, str) and not isinstance(merged.get(case), str):
                merged[case] = f"rank {rank}:\n{got}"
    return merged


def trial_curves(rank: int, world: int, port: int, out, overrides: list[str]) -> None:
    """A spawn_ranks target: one rank of a trial through the real trainer (`run_trial`) with
    `overrides` (cluster.num_workers is set to `world`). Rank 0 puts (train losses, val
    losses, status) on `out`; a rank that fails puts its error there."""
    rank_env(rank, world, port)

    from trainlab import names
    from trainlab.config import compose_run_config
    from trainlab.engine.run import run_trial

    run = compose_run_config([*overrides, f"cluster.num_workers={world}"])
    tracker = RecordingTracker()
    with reporting_to(out):
        result = run_trial(plan_here(run), tracker_factory=lambda *_: tracker)
        if rank == 0:
            out.put(([v for _, v in tracker.series(names.LOSS)],
                     [v for _, v in tracker.series(names.VAL_LOSS)], result.status))


@contextlib.contextmanager
def reporting_to(out):
    """Around a spawn_ranks target's body: an error goes onto `out` for the test to show, and
    the process group is closed after every rank got there."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - reported to the test
        out.put(repr(e))
        raise
    finally:
        close_distributed()
    finish_reporting(out)


def finish_reporting(out) -> None:
    """End a spawned rank whose work is done: flush `out` to the test. The rank then exits
    through the interpreter's own teardown, as a user's process does; close_distributed() has
    joined the backend threads that used to abort it there (exit -6)."""
    out.close()
    out.join_thread()  # the queue's feeder thread has sent everything


class RecordingTracker:
    """A Tracker that keeps everything in memory, for asserting on what a run logged."""

    def __init__(self):
        self.metrics: list[tuple[int, dict]] = []
        self.tags: dict = {}

    def log_metrics(self, metrics, *, step):
        self.metrics.append((step, dict(metrics)))

    def set_tags(self, tags):
        self.tags.update(tags)

    def log_artifact(self, path):
        pass

    def sync(self):
        pass

    def close(self):
        pass

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(step, m[key]) for step, m in self.metrics if key in m]

    def by_step(self, key: str) -> dict[int, float]:
        """Optimizer-step series of one metric (by_tokens twins have keys of their own)."""
        return dict(self.series(key))

    def keys(self) -> set[str]:
        return {k for _, m in self.metrics for k in m}

    def steps_with(self, prefix: str) -> list[int]:
        return sorted({step for step, m in self.metrics if any(k.startswith(prefix) for k in m)})


@pytest.fixture
def one_thread():
    """Tiny in-process trials: one torch thread avoids oversubscribing a busy 2-core machine
    (use with pytestmark = pytest.mark.usefixtures("one_thread"))."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def dist_info():
    """This process as a world of one on CPU (no process group)."""
    from trainlab.distributed import setup_distributed

    return setup_distributed("cpu")


@pytest.fixture
def recording_tracker() -> RecordingTracker:
    return RecordingTracker()


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray cluster per test worker, started as `trainlab train` starts its own
    (launch.ray_trial.start_local_cluster: on loopback, so a trial's group listens and connects
    there too; never a `ray start` cluster nor a crashed one's ray_current_cluster). Tests reach it
    through `ray_cluster` (in this process) or `joined_cluster` (a `trainlab` command joining it)."""
    from trainlab.launch.ray_trial import start_local_cluster, trial_runtime_env

    # with the dashboard, as trainlab starts Ray: it serves the state API, where Ray Train v2's
    # PlacementGroupCleaner asks whether a run's controller is alive; without it the answers fail
    # and a "not found" reads as dead, and the cleaner removed a live warm gang's placement group
    # mid-trial (CI, 2026-12-06: WorkerHealthCheckFailedError in test_warm_gangs); and with the
    # runtime env trainlab gives its jobs (its workers' priority among them)
    context = start_local_cluster(num_cpus=4, include_dashboard=True, runtime_env=trial_runtime_env())
    assert context.address_info["gcs_address"].startswith("127.0.0.1:"), context.address_info  # loopback only
    import ray

    yield ray
    ray.shutdown()


@pytest.fixture
def ray_cluster(ray_session):
    """The test worker's cluster (ray_session), every CPU of it free: the gangs `trainlab`
    commands of earlier tests kept warm there (joined_cluster) are ended first, as a command
    needing their CPUs would end them (launch.kept_gang.make_room), so no trial this test starts
    waits behind an idle one."""
    from trainlab.launch.kept_gang import end_kept_gangs

    if end_kept_gangs():
        total = ray_session.cluster_resources().get("CPU", 0)
        deadline = time.monotonic() + 120
        while (free := ray_session.available_resources().get("CPU", 0)) < total:
            assert time.monotonic() < deadline, f"{free:g} of {total:g} CPUs free 120 s after the kept gangs ended"
            time.sleep(0.5)
    return ray_session


@pytest.fixture
def joined_cluster(ray_session) -> SimpleNamespace:
    """What a `trainlab` command needs to join the test worker's cluster (ray_session) instead of
    starting its own, as a user joins a running one: `run` for a single run (cluster.address),
    `sweep(workers)` for a multirun, whose gangs are also kept warm for the next command
    (keep_warm_s) and which runs at most (CPUs of this machine // `workers`) trials at once.
    Trials that compute pass their worker count, as a cluster of their own would run them (the
    Hugging Face flow's 2-worker sweep alone on this 2-core machine: 105 s one at a time, 115 s
    two at once; 177-188 s two at once beside CI's other test worker); the parallel grid's
    10-step trials, bound by their gangs' start, run two at once (64-68 s in CI; 130 s one at a
    time on a cluster of its own). A test setting its own
    max_concurrent_trials puts it after these (Hydra keeps the last value).
    For the tests that test neither Ray's start or shutdown, a gang's start, signals nor faults:
    each command saves its cluster's start (~10 s, 13 CPU-s on 2 cores) and, where an earlier
    test kept a gang of its trials' shape, that gang's start (~16 s, 21 CPU-s; measurements page,
    2026-12-07)."""
    run = [f"cluster.address={ray_session.get_runtime_context().gcs_address}"]

    def sweep(workers: int = 1) -> list[str]:
        at_once = max(1, (os.cpu_count() or 1) // workers)
        return [*run, "hydra.launcher.keep_warm_s=600", f"hydra.launcher.max_concurrent_trials={at_once}"]

    return SimpleNamespace(run=run, sweep=sweep)


@pytest.fixture(scope="session")
def store_template(tmp_path_factory) -> Path:
    """An empty MLflow sqlite store with the schema made, once per test worker: alembic's
    migrations cost 3-6 s a store, opening a made one 0.1 s. Experiment 0 is taken out, so the
    first client of a copy makes it as it would in a new store (its artifact location under that
    client's working directory, its creation time now)."""
    import sqlite3

    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("store_template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("DELETE FROM experiments WHERE experiment_id = 0")
    return path


@pytest.fixture
def mlflow_db(tmp_path, store_template) -> Path:
    """tmp_path/mlflow.db, where a `trainlab` command run in tmp_path keeps its runs by default: a
    new store whose schema is already made (a copy of `store_template`). For the tests that do not
    test how a store is made (tests/unit/test_store.py does)."""
    return Path(shutil.copyfile(store_template, tmp_path / "mlflow.db"))


@pytest.fixture
def cli_env(tmp_path):
    """Environment for running the real `trainlab` CLI in a subprocess, in tmp_path: without the
    multi-node switch this module sets for the tests' own Ray (a user's shell has none; that a
    command keeps its cluster on loopback by itself is what test_loopback proves)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_") and k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def assert_refused(proc: subprocess.CompletedProcess, says, *, sessions, context: str = "") -> None:
    """Bad input as the CLI must refuse it: exit 2, one `error:` line holding every part of
    `says`, no traceback, no Ray session (`sessions`: what was found under the run's RAY_TMPDIR)."""
    shown = f"{context}\n--- stdout\n{proc.stdout[-2000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    assert proc.returncode == 2, shown
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, shown
    for part in says:
        assert part in errors[0], f"{part!r} not in the message{shown}"
    assert "Traceback" not in proc.stdout + proc.stderr, shown
    assert not sessions, f"a Ray session was started: {sessions}"


def ray_processes(ray_tmp: Path, *, named: str = "") -> list[psutil.Process]:
    """Every process of the Ray cluster a command started under `ray_tmp` (its RAY_TMPDIR), or only
    those whose command line starts with `named`. Ray renames its workers' command lines
    (`ray::RayTrainWorker`), so they are found by the RAY_TMPDIR they inherited, the GCS and raylet
    by the folder on their command lines."""
    mine = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            cmdline = proc.cmdline()
            if (proc.environ().get("RAY_TMPDIR") == str(ray_tmp) or str(ray_tmp) in " ".join(cmdline)) \
                    and (not named or cmdline[:1] and cmdline[0].startswith(named)):
                mine.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return mine


def kill_what_ray_left(ray_tmp: Path, *, timeout: float = 60) -> None:
    """SIGKILL every process of the Ray cluster a killed driver started under `ray_tmp`, and wait
    until they are gone (not by `pkill -f`, which misses Ray's renamed workers: a worker that
    outlived the kill went on writing checkpoints, step 21 after the newest was step 3 at the kill)."""
    mine = ray_processes(ray_tmp)
    for proc in mine:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    deadline = time.monotonic() + timeout
    while running := [p for p in mine if _run_state(p) not in (psutil.STATUS_ZOMBIE, None)]:  # a zombie runs nothing
        assert time.monotonic() < deadline, f"still running {timeout:.0f} s after SIGKILL: {running}"
        time.sleep(0.2)


def _run_state(proc: psutil.Process) -> str | None:
    try:
        return proc.status()
    except psutil.NoSuchProcess:
        return None


def kill_tree(marker: str) -> None:
    """SIGKILL the processes with `marker` on their command line and all their descendants: Ray
    renames its workers and agents (ray::RayTrainWorker), so only their parent raylet shows the
    node's temp dir; rank 0's MLflow writer is a worker's child. (-ww: ps cuts long command lines
    to 80 columns when not writing to a terminal.)"""
    ps = subprocess.run(["ps", "-ewwo", "pid=,ppid=,args="], capture_output=True, text=True, check=True)
    procs = []
    for line in ps.stdout.splitlines():
        pid, ppid, *args = line.split(None, 2)
        procs.append((int(pid), int(ppid), args[0] if args else ""))
    doomed = {pid for pid, _, args in procs if marker in args}
    while True:
        children = {pid for pid, ppid, _ in procs if ppid in doomed} - doomed
        if not children:
            break
        doomed |= children
    for pid in doomed - {os.getpid()}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@contextlib.contextmanager
def ray_head(num_cpus: int):
    """A one-node cluster of `num_cpus` CPUs started as a user starts one (`ray start --head`),
    on 127.0.0.1 only (multi-node clusters off, so no service binds another address), in a temp
    dir of its own; stopped by ending that dir's processes (`ray stop` would stop every Ray
    cluster on the machine). Yields (address, env): the env a command joining it runs with."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))}
    temp_dir = tempfile.mkdtemp(prefix="tlj", dir="/tmp")  # short: Ray's socket paths
    env["RAY_TMPDIR"] = temp_dir  # its address file too: no other cluster's `auto` is touched
    port = free_port()
    ray = str(Path(sys.executable).parent / "ray")
    try:
        subprocess.run([ray, "start", "--head", "--port", str(port), "--node-ip-address", "127.0.0.1",
                        "--num-cpus", str(num_cpus), "--temp-dir", temp_dir, "--include-dashboard", "false",
                        "--ray-client-server-port", str(free_port()), "--dashboard-agent-listen-port",
                        str(free_port()), "--disable-usage-stats"],
                       env=env | {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}, check=True, capture_output=True,
                       timeout=120)
        yield SimpleNamespace(address=f"127.0.0.1:{port}", env=env)
    finally:
        kill_tree(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def ray_train_runs(folder: Path) -> dict[Path, int]:
    """The Ray Train runs started under `folder`, each by the marker its fit() writes to validate
    its storage, with the marker's mtime (a later command's gang of the same name writes it again)."""
    return {p: p.stat().st_mtime_ns for p in Path(folder).rglob(".validate_storage_marker")}


def trainlab_cmd(*args: str) -> list[str]:
    """The installed console script, next to this interpreter."""
    return [str(Path(sys.executable).parent / "trainlab"), *args]


class MlflowServer:
    """A real `mlflow server` on loopback, as a user would start it, with a sqlite backend
    store and proxied artifacts under `root`. `kill` is a SIGKILL (a crash, no goodbye);
    `start` again serves the same port and store. With `template` (conftest.store_template) its
    store starts as a copy of that one, its schema made."""

    def __init__(self, root: Path, *, template: Path | None = None):
        self.root = root
        if template is not None:
            shutil.copyfile(template, root / "store.db")
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, *, timeout: float = 120) -> None:
        mlflow_bin = str(Path(sys.executable).parent / "mlflow")
        log = open(self.root / "server.log", "a")
        self.proc = subprocess.Popen(
            [mlflow_bin, "server", "--host", "127.0.0.1", "--port", str(self.port),
             "--backend-store-uri", f"sqlite:///{self.root / 'store.db'}",
             "--artifacts-destination", str(self.root / "artifacts"), "--workers", "1"],
            cwd=self.root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            # no job runner: one process fewer to start on a busy machine, tracking needs none
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((self.root / "server.log").read_text()[-3000:]) from None
                time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL the server and every process it started (its workers)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory, store_template):
    """A running MlflowServer for the module (its `.uri` is the tracking URI)."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow_server"), template=store_template)
    server.start()
    yield server
    server.stop()


@contextlib.contextmanager
def read_only_dir(path: Path):
    """`path` as a folder its user cannot write (mode 0o500; for root, whom modes do not stop,
    also the immutable attribute) for the block; yields False where that cannot be done here.
    Writable again afterwards, so the temporary folder can be removed."""
    path.mkdir(exist_ok=True)
    path.chmod(0o500)
    locked = os.geteuid() != 0 or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
    try:
        yield locked
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], capture_output=True)
        path.chmod(0o700)


# Chromium as this machine's probe starts it headless: without the background-networking
# switches it tries Google's hosts at every start, and this network refuses them.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium (/usr/bin/chromium) driven by Playwright: `browser.new_page(
    viewport={"width": 1600, "height": 1000})` opens a tab. .ci/run installs Chromium and sets
    TRAINLAB_REQUIRE_BROWSER=1, so a missing browser fails there; elsewhere the test skips."""
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("TRAINLAB_REQUIRE_BROWSER") == "1":
            pytest.fail("Chromium is not installed: `apt-get install -y chromium` (as .ci/run does)")
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def outside(monkeypatch):
    """A fresh copy of the engine's stop-from-outside request, as in a new Ray worker process."""
    import threading

    from trainlab.engine import preemption

    monkeypatch.setattr(preemption, "_outside", threading.Event())
    monkeypatch.setattr(preemption, "_listening", False)


def probe_free_trainer(overrides: list[str], dist_info):
    """build_trainer for `overrides` without the CPU matmul peak probe (it measures nothing a
    stop or resume test checks, and costs seconds on a busy machine)."""
    from trainlab.config import compose_run_config
    from trainlab.engine.run import build_trainer
    from trainlab.plan.trial_plan import Where, plan_trial
    from trainlab.telemetry import Peak, peak_flops

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(peak_flops, "cpu_probe_peak", lambda dtype, **_: Peak(1e11, f"probe:cpu:{dtype}"))
        return build_trainer(plan_trial(compose_run_config(overrides), Where(device=dist_info.device.type)), dist_info)


def train_off_main_thread(make_trainer: Callable, *, at: int, asks: tuple[str, ...], listen: bool = True):
    """Train off the main thread, as a Ray Train worker does (no signal handler can be installed
    there); at step `at` the driver's stop request arrives with each kind of `asks` in order
    (preemption.PREEMPT, PRUNE). `make_trainer()` builds the trainer in that thread. Returns
    the trainer's result."""
    import threading

    from trainlab.engine import preemption

    out = {}

    def work() -> None:
        if listen:
            preemption.listen_outside()
        trainer = make_trainer()
        trainer.add_hook(lambda tr, step, m: [preemption.stop_from_outside(k) for k in asks] if step == at else None)
        out["result"] = trainer.train()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return out["result"]


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory) -> dict[str, Path]:
    """Tiny Hugging Face models saved with save_pretrained (width 64, vocabulary 256, so data=text
    fits): 'llama' with 4 layers (pipelines cut it in 2 or 4), 'qwen2' with 2 (biased q/k/v), and
    'gpt_neox', 'gemma', 'phi' with 2 (families outside the Llama family)."""
    from trainlab.config.hf_model import TESTED_OTHER_FAMILIES
    from trainlab.models.hf_demo import write_demo_model

    root = tmp_path_factory.mktemp("hf_models")
    models = {"llama": write_demo_model(root / "llama", family="llama", vocab_size=256, num_hidden_layers=4),
              "qwen2": write_demo_model(root / "qwen2", family="qwen2", vocab_size=256, seed=1)}
    for seed, family in enumerate(TESTED_OTHER_FAMILIES, start=2):  # transformers' own forward (models.hf_any)
        models[family] = write_demo_model(root / family, family=family, vocab_size=256, seed=seed)
    return models
