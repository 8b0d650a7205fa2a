"""Addresses judged before anything waits on them: cluster.host against this machine's interface
list (no socket opened, no Ray imported), a Ray address 'auto' stands for, a tracking store that
does not answer or is damaged; and the store a trial's process group listens on.

No traffic leaves loopback: a refused address is never handed to a socket, and every address
contacted is 127.0.0.1 (an audit hook proves the first)."""

from __future__ import annotations

import ipaddress
import shutil
import socket
import sys
import time

import psutil
import pytest

from conftest import closed_port
from trainlab.config import ConfigError, compose_run_config
from trainlab.launch import interfaces
from trainlab.launch.interfaces import check_listen_host, interface_addresses, interface_of
from trainlab.launch.preflight import check_cluster, check_ray_address, preflight
from trainlab.redact import redact
from trainlab.tracking.store_check import check_server_answers, check_sqlite_store

BASE = ["model=tiny", "cluster.device=cpu", "tracking=none"]

# ---------------------------------------------------------------------------- guard
_events: list[tuple] = []
_armed: list[bool] = []


def _audit(event: str, args: tuple) -> None:
    if not _armed:
        return
    if event in ("socket.bind", "socket.connect", "socket.connect_ex", "socket.sendto", "socket.getaddrinfo"):
        _events.append((event, args[1:] if event != "socket.getaddrinfo" else args))
    elif event == "import" and args[0] == "ray":
        _events.append((event, args[0]))


sys.addaudithook(_audit)  # process-wide and for good: it records only while a test arms it


@pytest.fixture
def no_network():
    """Every socket bind/connect/send/name lookup and every `import ray` made while the test runs."""
    _events.clear()
    _armed.append(True)
    yield _events
    _armed.clear()


def _absent_address() -> str:
    """A documentation address (TEST-NET-1..3, RFC 5737) that no interface of this machine holds."""
    held = {a for addrs in interface_addresses().values() for a in addrs}
    for net in ("203.0.113.0/24", "198.51.100.0/24", "192.0.2.0/24"):
        for ip in list(ipaddress.ip_network(net).hosts())[200:]:
            if str(ip) not in held:
                return str(ip)
    raise AssertionError("every documentation address is on an interface")  # pragma: no cover


# ---------------------------------------------------------------------------- cluster.host
def test_an_address_no_interface_holds_is_refused_without_touching_the_network(no_network):
    absent = _absent_address()
    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        check_listen_host(absent)
    assert time.perf_counter() - start < 2
    msg = str(info.value)
    assert f"cluster.host={absent!r}" in msg and "not an address of this machine" in msg
    assert "127.0.0.1" in msg and "0.0.0.0" in msg  # the fix, and the addresses it may choose from
    assert no_network == [], f"the check opened sockets or imported Ray: {no_network}"


def test_preflight_refuses_it_before_ray(no_network):
    absent = _absent_address()
    run = compose_run_config([*BASE, f"cluster.host={absent}"])
    with pytest.raises(ConfigError, match=f"cluster.host='{absent}'"):
        preflight(run, tracking_uri=None)
    assert no_network == [], f"preflight opened sockets or imported Ray: {no_network}"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "0.0.0.0", "::"])
def test_loopback_and_wildcards_pass(host, no_network):
    check_listen_host(host)
    assert no_network == []


def test_every_address_of_this_machine_passes(no_network):
    held = [a for addrs in interface_addresses().values() for a in addrs]
    assert "127.0.0.1" in held
    for address in held:
        check_listen_host(address)
    assert no_network == []


def test_a_host_name_is_refused_unresolved(no_network):
    with pytest.raises(ValueError, match="cluster.host='head-node' is not an IP address"):
        check_listen_host("head-node")
    assert no_network == []  # no name lookup either


def test_interface_list_without_psutil_agrees_with_psutil():
    by_psutil = interface_addresses()
    by_kernel = interfaces._from_proc()
    for name, addrs in by_kernel.items():
        assert set(addrs) <= set(by_psutil[name]), (name, addrs, by_psutil[name])
    ipv4 = {(n, a) for n, addrs in by_psutil.items() for a in addrs if "." in a}
    assert ipv4 == {(n, a) for n, addrs in by_kernel.items() for a in addrs if "." in a}


def test_interface_of_loopback():
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of(_absent_address()) is None


# ---------------------------------------------------------------------------- cluster.address=auto
def test_a_stale_recorded_cluster_is_refused_fast(monkeypatch, tmp_path):
    """`ray start` records its GCS address in $RAY_TMPDIR/ray/ray_current_cluster; a cluster killed
    without `ray stop` leaves it behind, and ray.init(address='auto') then retried for minutes."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    (tmp_path / "ray").mkdir()
    recorded = tmp_path / "ray" / "ray_current_cluster"
    port = closed_port()
    recorded.write_text(f"127.0.0.1:{port}")
    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        check_ray_address("auto", timeout_s=5)
    assert time.perf_counter() - start < 5
    msg = str(info.value)
    assert "cluster.address='auto'" in msg and str(recorded) in msg and f"127.0.0.1:{port}" in msg
    assert "nothing answers" in msg and "ray start --head" in msg


def test_a_dead_ray_address_in_the_environment_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{closed_port()}")
    with pytest.raises(ValueError, match=r"cluster.address='auto' \(from RAY_ADDRESS='127.0.0.1:\d+'\)"):
        check_ray_address("auto", timeout_s=5)


def test_a_silent_ray_address_is_refused_within_its_bound():
    """A head that takes the connection and says nothing (a firewall, a wrong service) costs
    cluster.start_timeout_s, named in the message."""
    with socket.socket() as server:  # connections queue in the backlog, none is accepted
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        filler = socket.create_connection(server.getsockname())  # fills the backlog of one
        try:
            start = time.perf_counter()
            with pytest.raises(ValueError) as info:
                check_ray_address(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=0.5)
            took = time.perf_counter() - start
        finally:
            filler.close()
    if "Connection refused" in str(info.value):
        pytest.skip("this kernel refuses past a full backlog instead of leaving the SYN unanswered")
    assert took < 3
    assert "no answer within cluster.start_timeout_s=0.5 s" in str(info.value)


@pytest.mark.parametrize("address", ["not a host", "head:abc", "head:99999", "http2://head:1"])
def test_malformed_ray_addresses_are_refused_unresolved(address, no_network):
    run = compose_run_config([*BASE, "cluster=ray", f"cluster.address={address}"])
    with pytest.raises(ValueError, match="is not a Ray address"):
        check_cluster(run)
    assert no_network == []


# ---------------------------------------------------------------------------- tracking stores
def test_a_server_that_does_not_answer_is_refused_within_its_bound():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)  # accepts into the backlog, never answers
        uri = f"http://127.0.0.1:{server.getsockname()[1]}"
        start = time.perf_counter()
        with pytest.raises(ValueError) as info:
            check_server_answers(uri, field="--tracking-uri", fix="start it", timeout_s=0.5)
        assert time.perf_counter() - start < 3
    assert f"--tracking-uri='{uri}'" in str(info.value) and "no answer within 0.5 s" in str(info.value)


def test_a_password_in_a_uri_is_never_shown():
    with pytest.raises(ValueError) as info:
        check_server_answers(f"http://me:s3cret@127.0.0.1:{closed_port()}", field="f", fix="x", timeout_s=1)
    assert "s3cret" not in str(info.value) and "me:***@127.0.0.1" in str(info.value)
    assert redact("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


@pytest.fixture(scope="module")
def real_store(tmp_path_factory):
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    client = MlflowClient(tracking_uri=f"sqlite:///{path}")
    run = client.create_run(client.create_experiment("e"))
    client.log_metric(run.info.run_id, "train/loss", 1.0, step=1)
    client.set_terminated(run.info.run_id)
    return path


def _check(path):
    check_sqlite_store(path, field="tracking.uri", uri=f"sqlite:///{path}", elsewhere="use another")


def test_a_real_store_passes(real_store):
    _check(real_store)


@pytest.mark.parametrize("damage", ["header", "a_table_page"])
def test_a_damaged_store_is_refused_and_left_as_it_was(damage, real_store, tmp_path):
    path = tmp_path / "mlflow.db"
    shutil.copy(real_store, path)
    data = bytearray(path.read_bytes())
    if damage == "header":
        data[:100] = bytes(range(100))
    else:  # page 2 onwards of a table, the schema (page 1) intact
        import sqlite3

        with sqlite3.connect(real_store) as con:
            page = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'experiments'").fetchone()[0]
        size = int.from_bytes(data[16:18], "big")
        data[(page - 1) * size:page * size] = b"\xab" * size
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError) as info:
        _check(path)
    msg = str(info.value)
    assert f"tracking.uri='sqlite:///{path}'" in msg and "restore it from a backup" in msg
    assert path.read_bytes() == bytes(data)


def test_a_database_that_is_not_an_mlflow_store_is_refused(tmp_path):
    import sqlite3

    with sqlite3.connect(tmp_path / "other.db") as con:
        con.execute("CREATE TABLE t (x)")
    with pytest.raises(ValueError, match="not an MLflow store"):
        _check(tmp_path / "other.db")


# ---------------------------------------------------------------------------- the process group's store
def test_the_trial_store_listens_on_the_address_it_is_given():
    """c10d's own TCPStore server listens on every interface ('::') whatever host it is given."""
    from trainlab.launch.bound_group import open_store

    store = open_store("127.0.0.1", world_size=1, timeout_s=10)
    store.set("k", "v")
    assert store.get("k") == b"v"
    listening = {c.laddr.ip for c in psutil.Process().net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == store.port}
    assert listening == {"127.0.0.1"}


def test_gloo_and_nccl_are_pinned_to_the_node_ip_interface(monkeypatch):
    from trainlab.launch.bound_group import pin_interfaces

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "")  # unset, as far as gloo goes; restored after
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")  # the user's choice stays
    assert pin_interfaces("127.0.0.1") == {"GLOO_SOCKET_IFNAME": "lo"}
    import os

    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo" and os.environ["NCCL_SOCKET_IFNAME"] == "ib0"
    assert pin_interfaces(_absent_address()) == {}
