"""Addresses that used to hang or end in a traceback, through the real CLI: each now exits 2
within seconds with one `error:` line naming the input, the bound waited (if any) and the fix.

Each command runs in a fresh interpreter under an audit hook that kills it (exit 97) if it
binds, connects, sends to or looks up the address that must never be used, and (exit 98) if it
imports Ray where nothing may start: a refused address is judged from the machine's interface
list alone, and no traffic leaves the loopback.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]  # 19 CLI runs, 3 at a time: ~1 min on 2 idle cores

LIMIT_S = 100
"""A command still running after this long hangs: each check waits at most 10 s and a command
costs ~10 CPU-s (three torch imports' worth here), 3 at a time on 2 cores beside another test
worker; what hung before waited for minutes (a SYN to an absent address gives up after ~127 s,
a silent peer never answers)."""
AT_ONCE_S = 75
"""A refusal's wall time on a loaded 2-core machine, a long way from a hang's."""
TINY = ["model=tiny", "train.max_steps=2", "train.seq_len=32", "train.global_batch_size=4",
        "train.micro_batch_size=2", "cluster.num_workers=2", "cluster.device=cpu"]

_GUARD = """
import os, sys
FORBIDDEN, NO_RAY = sys.argv.pop(1), sys.argv.pop(1) == "1"

def _audit(event, args):
    if event in ("socket.bind", "socket.connect", "socket.connect_ex", "socket.sendto"):
        address = args[1]
        if isinstance(address, tuple) and address and address[0] == FORBIDDEN:
            os.write(2, f"GUARD: {event} {address}".encode()); os._exit(97)
    elif event == "socket.getaddrinfo" and args[0] == FORBIDDEN:
        os.write(2, f"GUARD: getaddrinfo {args[0]}".encode()); os._exit(97)
    elif event == "import" and args[0] == "ray" and NO_RAY:
        os.write(2, b"GUARD: import ray"); os._exit(98)

sys.addaudithook(_audit)
from trainlab.cli import main
sys.argv[0] = "trainlab"
main(sys.argv[1:])
"""


def _absent_address() -> str:
    """A documentation address (RFC 5737) no interface of this machine holds."""
    import psutil

    held = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
    return next(str(ip) for net in ("203.0.113.0/24", "198.51.100.0/24", "192.0.2.0/24")
                for ip in list(ipaddress.ip_network(net).hosts())[200:] if str(ip) not in held)


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    """The command line after `trainlab`; {names} are filled from the world fixture."""
    says: tuple[str, ...]
    """Substrings of the one `error:` line."""
    env: tuple[tuple[str, str], ...] = ()
    ray_allowed: bool = False
    """The command may import Ray (submit, status, ...: Ray's Jobs client)."""


def C(id: str, args: list[str], says: list[str], env: dict | None = None, ray: bool = False) -> Case:  # noqa: N802
    return Case(id, tuple(args), tuple(says), tuple((env or {}).items()), ray)


CASES = [
    # -------------------------------------------------------------- cluster.host: refused from the interface list
    C("host_not_on_this_machine", ["train", *TINY, "tracking=none", "cluster.host={absent}"],
      ["cluster.host='{absent}'", "not an address of this machine", "127.0.0.1", "0.0.0.0"]),
    C("host_not_on_this_machine_in_a_sweep", ["train", "-m", *TINY, "seed=1,2", "tracking=none",
                                              "cluster.host={absent}"],
      ["cluster.host='{absent}'", "not an address of this machine"]),
    # -------------------------------------------------------------- cluster.address=auto, no cluster running
    C("auto_address_stale_record", ["train", *TINY, "tracking=none", "cluster=ray", "cluster.address=auto"],
      ["cluster.address='auto'", "{ray_tmp}/ray/ray_current_cluster", "127.0.0.1:{closed}", "nothing answers",
       "ray start --head"], env={"RAY_TMPDIR": "{ray_tmp}"}),
    C("auto_address_dead_env", ["train", *TINY, "tracking=none", "cluster=ray", "cluster.address=auto"],
      ["RAY_ADDRESS='127.0.0.1:{closed}'", "nothing answers", "cluster=local"],
      env={"RAY_ADDRESS": "127.0.0.1:{closed}"}),
    C("auto_address_stale_record_in_a_sweep", ["train", "-m", *TINY, "seed=1,2", "tracking=none", "cluster=ray",
                                               "cluster.address=auto"],
      ["cluster.address='auto'", "nothing answers"], env={"RAY_TMPDIR": "{ray_tmp}"}),
    # -------------------------------------------------------------- tracking stores
    C("compare_server_refuses", ["compare", "--sweep", "s", "--tracking-uri", "http://127.0.0.1:{closed}"],
      ["--tracking-uri='http://127.0.0.1:{closed}'", "does not answer", "mlflow server"]),
    C("compare_server_silent", ["compare", "--sweep", "s", "--tracking-uri", "http://127.0.0.1:{silent}"],
      ["--tracking-uri='http://127.0.0.1:{silent}'", "no answer within 5 s"]),
    C("compare_store_header_garbage", ["compare", "--sweep", "s", "--tracking-uri", "sqlite:///{bad_header}"],
      ["{bad_header}", "not a readable SQLite database", "restore it from a backup", "--tracking-uri"]),
    C("compare_store_page_garbage", ["compare", "--sweep", "s", "--tracking-uri", "sqlite:///{bad_page}"],
      ["{bad_page}", "is damaged", "restore it from a backup"]),
    C("compare_store_from_env", ["compare", "--sweep", "s"], ["MLFLOW_TRACKING_URI=", "{bad_header}"],
      env={"MLFLOW_TRACKING_URI": "sqlite:///{bad_header}"}),
    C("compare_negative_tolerance", ["compare", "--sweep", "s", "--tolerance", "-1", "--tracking-uri",
                                     "sqlite:///{bad_header}"], ["--tolerance", "-1.0", ">= 0"]),
    C("train_store_damaged", ["train", *TINY, "tracking.uri=sqlite:///{bad_page}"],
      ["tracking.uri='sqlite:///{bad_page}'", "is damaged", "tracking=none"]),
    C("sweep_store_damaged", ["train", "-m", *TINY, "seed=1,2", "tracking.uri=sqlite:///{bad_page}"],
      ["tracking.uri='sqlite:///{bad_page}'", "is damaged"]),
    # -------------------------------------------------------------- Ray Jobs commands
    C("submit_nothing_answers", ["submit", "--address", "http://127.0.0.1:{closed}", "--", "model=tiny"],
      ["--address='http://127.0.0.1:{closed}'", "no Ray dashboard answers", "ray start --head"], ray=True),
    C("submit_not_a_url", ["submit", "--address", "not a url", "--", "model=tiny"],
      ["--address='not a url'", "not the URL", "http://HEAD:8265"], ray=True),
    C("submit_bad_override", ["submit", "--address", "http://127.0.0.1:{closed}", "--", "model=huge"],
      ["model=huge", "choose one of"], ray=True),
    C("submit_address_from_env", ["submit", "--", "model=tiny"], ["RAY_ADDRESS='auto'", "http://HEAD:8265"],
      env={"RAY_ADDRESS": "auto"}, ray=True),
    C("status_nothing_answers", ["status", "raysubmit_x", "--address", "http://127.0.0.1:{closed}"],
      ["--address='http://127.0.0.1:{closed}'", "no Ray dashboard answers"], ray=True),
    C("logs_silent_dashboard", ["logs", "raysubmit_x", "--address", "http://127.0.0.1:{silent}"],
      ["--address='http://127.0.0.1:{silent}'", "no answer within 10 s"], ray=True),
]


@dataclass
class Outcome:
    returncode: int
    stderr: str
    seconds: float
    ray_session: list[str]


def _damaged_copies(work: Path) -> dict[str, Path]:
    """A real MLflow store with a run in it, and two copies of it: garbage over the header, and
    garbage over one table's page (the schema intact)."""
    from mlflow.tracking import MlflowClient

    real = work / "real.db"
    client = MlflowClient(tracking_uri=f"sqlite:///{real}")
    run = client.create_run(client.create_experiment("s"))
    client.log_metric(run.info.run_id, "train/loss", 1.0, step=1)
    client.set_terminated(run.info.run_id)
    header, page = work / "bad_header.db", work / "bad_page.db"
    for p in (header, page):
        shutil.copy(real, p)
    data = bytearray(header.read_bytes())
    data[:100] = bytes(range(100))
    header.write_bytes(bytes(data))
    with sqlite3.connect(real) as con:
        root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'experiments'").fetchone()[0]
    data = bytearray(page.read_bytes())
    size = int.from_bytes(data[16:18], "big")
    data[(root - 1) * size:root * size] = b"\xab" * size
    page.write_bytes(bytes(data))
    return {"bad_header": header, "bad_page": page}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    work = tmp_path_factory.mktemp("net")
    stores = _damaged_copies(work)
    before = {k: p.read_bytes() for k, p in stores.items()}
    ray_tmp = Path(tempfile.mkdtemp(prefix="tlnet-", dir="/tmp"))  # short: Ray's socket paths
    (ray_tmp / "ray").mkdir()
    # bound, never listening: connecting is refused, and no other process (a Ray started by
    # another case or test) can take the port while the cases run, as it could a port let go
    refusing = socket.socket()
    refusing.bind(("127.0.0.1", 0))
    closed = refusing.getsockname()[1]
    # what `ray start` leaves behind when its cluster is killed rather than stopped
    (ray_tmp / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{closed}")
    silent = socket.socket()  # takes connections into its backlog and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    names = {"absent": _absent_address(), "closed": closed, "silent": silent.getsockname()[1],
             "ray_tmp": ray_tmp, **stores}
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_", "HYDRA_"))}
    base["PYTHONUNBUFFERED"] = "1"

    def run(case: Case) -> Outcome:
        args = [a.format(**names) for a in case.args]
        with tempfile.TemporaryDirectory(prefix="tlnet-", dir="/tmp") as own_tmp:
            env = {**base, "RAY_TMPDIR": own_tmp, "TMPDIR": own_tmp,
                   **{k: v.format(**names) for k, v in case.env}}
            start = time.perf_counter()
            try:
                proc = subprocess.run([sys.executable, "-c", _GUARD, names["absent"],
                                       "0" if case.ray_allowed else "1", *args],
                                      cwd=work, env=env, capture_output=True, text=True, timeout=LIMIT_S)
                code, stderr = proc.returncode, proc.stderr
            except subprocess.TimeoutExpired as e:  # the hang this file is about
                code, stderr = -9, f"still waiting after {LIMIT_S} s\n{e.stderr or ''}"
            seconds = time.perf_counter() - start
            session = [str(p) for root in (own_tmp, ray_tmp) for p in Path(root).rglob("session_*")]
        return Outcome(code, stderr if isinstance(stderr, str) else stderr.decode(errors="replace"), seconds,
                       session)

    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            results = dict(zip([c.id for c in CASES], pool.map(run, CASES)))
    finally:
        silent.close()
        refusing.close()
    after = {k: p.read_bytes() for k, p in stores.items()}
    yield results, names, before == after
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused_at_once_in_one_line(case, outcomes):
    results, names, _ = outcomes
    out = results[case.id]
    shown = f"\n--- stderr\n{out.stderr[-3000:]}"
    assert "GUARD:" not in out.stderr, f"touched the forbidden address or started Ray{shown}"
    assert out.returncode == 2, shown
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, shown
    for part in case.says:
        assert part.format(**names) in errors[0], f"{part.format(**names)!r} not in the message{shown}"
    assert "Traceback" not in out.stderr, shown
    assert not out.ray_session, f"a Ray session was started: {out.ray_session}"
    assert out.seconds < AT_ONCE_S, f"took {out.seconds:.0f} s"


def test_damaged_stores_are_left_as_they_were(outcomes):
    _, _, unchanged = outcomes
    assert unchanged, "a damaged store was written to"
