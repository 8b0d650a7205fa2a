"""One driver per study: a second driver of the same sweep in the same store is refused in one
line naming the first, whether the first runs on this machine (its lock file) or another (its
parent run's heartbeat); a driver that is gone holds nothing."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from trainlab import names
from trainlab.tracking import study_owner
from trainlab.tracking.study_owner import StudyHeld, check_parent_free, own_study
from trainlab.vocab.processes import process_id


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_a_second_driver_of_the_same_study_is_refused_until_the_first_releases(tmp_path, mlflow_db):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    first = own_study(tracking_uri=uri, sid="abc", sweep_name="shootout")
    with pytest.raises(StudyHeld) as e:
        own_study(tracking_uri=uri, sid="abc", sweep_name="shootout")
    said = str(e.value)
    assert "sweep_name='shootout' is running already" in said
    assert f"pid {process_id().split(' ')[1]}" in said and "sweep_name=shootout-2" in said
    # another study, or the same sweep in another store, is not held
    own_study(tracking_uri=uri, sid="other", sweep_name="shootout").release()
    own_study(tracking_uri=f"sqlite:///{tmp_path}/other.db", sid="abc", sweep_name="shootout").release()
    first.release()
    own_study(tracking_uri=uri, sid="abc", sweep_name="shootout").release()


def test_a_killed_driver_holds_no_lock(tmp_path, mlflow_db):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    code = ("import sys, time; from trainlab.tracking.study_owner import own_study; "
            f"o = own_study(tracking_uri={uri!r}, sid='abc', sweep_name='s'); print('held', flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(StudyHeld, match=f"pid {child.pid}"):
            own_study(tracking_uri=uri, sid="abc", sweep_name="s")
    finally:
        child.kill()
        child.wait()
    own_study(tracking_uri=uri, sid="abc", sweep_name="s").release()


class _Run:  # the two fields of an MLflow Run that decide
    def __init__(self, status: str, tags: dict):
        self.info = type("Info", (), {"status": status})()
        self.data = type("Data", (), {"tags": tags})()


def test_a_running_parent_is_its_live_drivers(tmp_path):
    uri = "sqlite:///x.db"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        alive = process_id(sleeper.pid)
        with pytest.raises(StudyHeld, match=f"pid {sleeper.pid}"):
            check_parent_free(_Run("RUNNING", {names.TAG_DRIVER: alive}), sweep_name="s", tracking_uri=uri)
        check_parent_free(_Run("FINISHED", {names.TAG_DRIVER: alive}), sweep_name="s", tracking_uri=uri)
    finally:
        sleeper.kill()
        sleeper.wait()
    check_parent_free(_Run("RUNNING", {names.TAG_DRIVER: alive}), sweep_name="s", tracking_uri=uri)  # gone
    check_parent_free(_Run("RUNNING", {names.TAG_DRIVER: process_id()}), sweep_name="s", tracking_uri=uri)  # mine


def test_another_hosts_driver_holds_its_parent_while_its_heartbeat_is_recent():
    uri = "sqlite:///x.db"
    elsewhere = "other-host 4242 1700000000"
    recent = {names.TAG_DRIVER: elsewhere, names.TAG_HEARTBEAT: str(int(time.time()) - 10)}
    with pytest.raises(StudyHeld, match="host other-host, pid 4242"):
        check_parent_free(_Run("RUNNING", recent), sweep_name="s", tracking_uri=uri)
    stale = {names.TAG_DRIVER: elsewhere,
             names.TAG_HEARTBEAT: str(int(time.time() - study_owner.STALE_AFTER_S - 5))}
    check_parent_free(_Run("RUNNING", stale), sweep_name="s", tracking_uri=uri)
    check_parent_free(_Run("RUNNING", {names.TAG_DRIVER: elsewhere}), sweep_name="s", tracking_uri=uri)
