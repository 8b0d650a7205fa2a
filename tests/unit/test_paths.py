"""Driver-side resolution of user paths (launch.paths), tracking URI forms (tracking.store,
tracking.store_check) and credential masking (redact). Only 127.0.0.1 is ever contacted."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys

import pytest

from trainlab.config import ConfigError, compose_run_config
from trainlab.launch.paths import absolute, resolve_paths, shared_storage_notes
from trainlab.redact import redact, redact_files, register_secret, split_userinfo
from trainlab.tracking.store import tracking_store
from trainlab.tracking.store_check import check_tracking_uri

BASE = ["model=tiny", "cluster.device=cpu"]
PASSWORD = "s3cret-Pw-42"


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.setenv(var, "")  # recorded, so what resolve_paths sets is undone after the test
        monkeypatch.delenv(var)
    return monkeypatch


def _run(*overrides: str):
    return compose_run_config([*BASE, *overrides])


# ---------------------------------------------------------------------------- paths
def test_absolute_joins_the_cwd_and_expands_home(monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    assert absolute("tok.bin", cwd="/work/run") == "/work/run/tok.bin"
    assert absolute("./a/../tok.bin", cwd="/work/run") == "/work/run/tok.bin"
    assert absolute("~/data/tok.bin", cwd="/work/run") == "/home/someone/data/tok.bin"
    assert absolute("/srv/tok.bin", cwd="/work/run") == "/srv/tok.bin"
    assert absolute("", cwd="/work/run") == ""


def test_every_path_field_is_made_absolute(clean_env, tmp_path):
    run = _run("data=tokens", "data.path=tok.bin", "data.vocab_size=100", "train.resume=ckpt/step_00000002",
               "train.checkpoint_dir=ckpts", "output_dir=out", "tracking.uri=sqlite:///runs/m.db")
    got = resolve_paths(run, cwd=str(tmp_path))
    assert got.data.path == str(tmp_path / "tok.bin")
    assert got.train.resume == str(tmp_path / "ckpt" / "step_00000002")
    assert got.train.checkpoint_dir == str(tmp_path / "ckpts")
    assert got.output_dir == str(tmp_path / "out")
    assert got.tracking.uri == f"sqlite:///{tmp_path}/runs/m.db"
    assert run.data.path == "tok.bin"  # the caller's config is left as it was
    assert resolve_paths(got, cwd="/elsewhere") == got  # resolving again changes nothing


def test_keywords_and_unset_fields_stay(clean_env, tmp_path):
    for resume in ("auto", "never"):
        got = resolve_paths(_run(f"train.resume={resume}"), cwd=str(tmp_path))
        assert got.train.resume == resume
        assert got.train.checkpoint_dir == "" and got.output_dir == ""
        assert got.tracking.uri == ""  # "$MLFLOW_TRACKING_URI or the default", as recorded


def test_data_path_of_another_corpus_is_left_alone(clean_env, tmp_path):
    run = dataclasses.replace(_run(), data=dataclasses.replace(_run().data, path="ignored.bin"))
    assert resolve_paths(run, cwd=str(tmp_path)).data.path == "ignored.bin"  # data=text ignores it


def test_tracking_none_ignores_a_bad_environment_uri(clean_env, tmp_path):
    clean_env.setenv("MLFLOW_TRACKING_URI", "garbage:::x")
    assert resolve_paths(_run("tracking=none"), cwd=str(tmp_path)).tracking.name == "none"
    with pytest.raises(ConfigError, match="MLFLOW_TRACKING_URI='garbage:::x'"):
        resolve_paths(_run(), cwd=str(tmp_path))


def test_server_credentials_leave_the_uri_for_mlflows_variables(clean_env, tmp_path):
    run = _run(f"tracking.uri=http://trainer:{PASSWORD}@127.0.0.1:5000")
    got = resolve_paths(run, cwd=str(tmp_path))
    assert got.tracking.uri == "http://127.0.0.1:5000"
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "trainer"
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == PASSWORD
    assert redact(f"a message quoting {PASSWORD} alone") == "a message quoting *** alone"


def test_remote_cluster_names_every_path_its_workers_open(clean_env, tmp_path):
    run = resolve_paths(_run("data=tokens", "data.path=tok.bin", "data.vocab_size=100",
                             "train.resume=ckpt/step_00000002", "output_dir=out",
                             "tracking.uri=sqlite:///m.db", "cluster=ray", "cluster.address=10.0.0.1:6379"),
                        cwd=str(tmp_path))
    notes = shared_storage_notes(run)
    assert len(notes) == 4, notes
    for field, path in [("data.path", tmp_path / "tok.bin"), ("train.resume", tmp_path / "ckpt" / "step_00000002"),
                        ("output_dir", tmp_path / "out" / "checkpoints"), ("tracking.uri", tmp_path / "m.db")]:
        note = next(n for n in notes if f"{field}=" in n)
        assert str(path) in note and "every node must see that absolute path" in note
        assert "cluster.address='10.0.0.1:6379'" in note


def test_remote_cluster_with_mlflows_default_store_is_named(clean_env, tmp_path):
    clean_env.chdir(tmp_path)
    notes = shared_storage_notes(resolve_paths(_run("cluster=ray", "cluster.address=10.0.0.1:6379")))
    assert any(f"tracking.uri='sqlite:///{tmp_path}/mlflow.db'" in n for n in notes), notes
    clean_env.setenv("MLFLOW_TRACKING_URI", "mlruns")
    notes = shared_storage_notes(resolve_paths(_run("cluster=ray", "cluster.address=10.0.0.1:6379")))
    assert any(f"MLFLOW_TRACKING_URI='file://{tmp_path}/mlruns'" in n for n in notes), notes


def test_local_cluster_and_a_server_store_need_no_note(clean_env, tmp_path):
    assert shared_storage_notes(resolve_paths(_run("data=tokens", "data.path=t.bin", "data.vocab_size=100"),
                                              cwd=str(tmp_path))) == []
    remote = resolve_paths(_run("cluster=ray", "cluster.address=10.0.0.1:6379",
                                "tracking.uri=http://127.0.0.1:5000"), cwd=str(tmp_path))
    assert [n for n in shared_storage_notes(remote) if "tracking.uri" in n] == []


# ---------------------------------------------------------------------------- tracking URI forms
@pytest.mark.parametrize("uri, want", [
    ("sqlite:///m.db", "sqlite:///{cwd}/m.db"),
    ("sqlite:////abs/m.db", "sqlite:////abs/m.db"),
    ("sqlite:///m.db?timeout=20", "sqlite:///{cwd}/m.db?timeout=20"),
    ("mlruns", "file://{cwd}/mlruns"),
    ("file:mlruns", "file://{cwd}/mlruns"),
    ("file:///abs/mlruns", "file:///abs/mlruns"),
    ("file://localhost/abs/mlruns", "file:///abs/mlruns"),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ("https://mlflow.example:443/", "https://mlflow.example:443/"),
    ("postgresql+psycopg2://u:p@127.0.0.1/db", "postgresql+psycopg2://u:p@127.0.0.1/db"),
    ("databricks", "databricks"),
])
def test_accepted_forms(uri, want, tmp_path):
    assert tracking_store(uri, environ={}, cwd=str(tmp_path)).uri == want.format(cwd=tmp_path)


@pytest.mark.parametrize("uri, says", [
    ("sqlite://mlflow2.db", ["two slashes", "sqlite:///mlflow2.db", "sqlite:////{cwd}/mlflow2.db"]),
    ("sqlite://", ["in-memory"]),
    ("sqlite:///:memory:", ["in-memory", "sqlite:///mlflow.db"]),
    ("file://mlruns", ["file:///{cwd}/mlruns", "plain path mlruns"]),
    ("garbage:::x", ["scheme 'garbage'", "http://HOST:PORT"]),
    ("http://", ["names no host"]),
    ("http://127.0.0.1:99999", ["port"]),
    ("postgresql://u:p@127.0.0.1", ["names no database"]),
])
def test_misread_forms_are_refused(uri, says, tmp_path):
    with pytest.raises(ValueError) as info:
        tracking_store(uri, environ={}, cwd=str(tmp_path))
    msg = str(info.value)
    assert msg.startswith(f"tracking.uri={redact(uri)!r}"), msg
    for part in says:
        assert part.format(cwd=str(tmp_path).lstrip("/")) in msg, msg


def test_the_environment_uri_is_named_as_such(tmp_path):
    with pytest.raises(ValueError) as info:
        tracking_store("", environ={"MLFLOW_TRACKING_URI": "sqlite://x.db"}, cwd=str(tmp_path))
    assert str(info.value).startswith("MLFLOW_TRACKING_URI='sqlite://x.db'")
    assert "unset MLFLOW_TRACKING_URI" in str(info.value)
    store = tracking_store("", environ={"MLFLOW_TRACKING_URI": "http://127.0.0.1:1"}, cwd=str(tmp_path))
    assert store.source == "MLFLOW_TRACKING_URI"


def test_a_server_uri_gives_up_its_credentials(tmp_path):
    store = tracking_store("http://me:p%40ss%3Aword@127.0.0.1:5000/prefix", environ={}, cwd=str(tmp_path))
    assert (store.uri, store.username, store.password) == ("http://127.0.0.1:5000/prefix", "me", "p@ss:word")
    assert "p@ss" not in repr(store)
    token_only = tracking_store("https://tok123@127.0.0.1:5000", environ={}, cwd=str(tmp_path))
    assert token_only.uri == "https://tok123@127.0.0.1:5000" and token_only.password is None  # requests sends it


# ---------------------------------------------------------------------------- store checks
def test_database_without_its_driver_is_refused_without_the_password(monkeypatch):
    # postgresql:// is SQLAlchemy's psycopg2 dialect: hidden here, so the test runs where it is installed
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    with socket.socket() as listening:  # something answers: the check gets past the connection
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        with pytest.raises(ValueError) as info:
            check_tracking_uri(f"postgresql://u:{PASSWORD}@127.0.0.1:{port}/db")
    msg = str(info.value)
    assert "psycopg" in msg and "pip install" in msg and PASSWORD not in msg, msg


def test_unreachable_database_is_refused_within_the_bound():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ValueError) as info:
        check_tracking_uri(f"mysql://u:{PASSWORD}@127.0.0.1:{port}/db", timeout_s=2)
    msg = str(info.value)
    assert f"127.0.0.1:{port}" in msg and "within 2 s" in msg and PASSWORD not in msg and "u:***@" in msg


# ---------------------------------------------------------------------------- redaction
def test_redact_masks_passwords_in_urls_anywhere():
    text = (f"tracking.uri=http://me:{PASSWORD}@h:5000 and 'postgresql://u:{PASSWORD}@db/x' "
            "and https://tok123@h/x and http://h:5000/a@b")
    assert redact(text) == ("tracking.uri=http://me:***@h:5000 and 'postgresql://u:***@db/x' "
                            "and https://***@h/x and http://h:5000/a@b")


def test_redact_reads_urls_as_urlsplit_and_hydra_write_them():
    assert redact("http://u:p@ss@h:1/x") == "http://u:***@h:1/x"  # an unencoded '@' in the password
    assert redact(r"job #0 (tracking.uri=http\://u\:pw-1@127.0.0.1\:1 seed=0)") == (
        r"job #0 (tracking.uri=http\://u\:***@127.0.0.1\:1 seed=0)")  # a sweep job's escaped override


def test_registered_secrets_are_masked_in_every_form():
    register_secret("p%40ss-word-9")
    assert redact("got p@ss-word-9 and p%40ss-word-9") == "got *** and ***"
    register_secret("ab")  # too short to mask outside a URL without mangling other text
    assert redact("about ab") == "about ab"


def test_split_userinfo():
    assert split_userinfo("http://u:p@h:1/x?q=1") == ("http://h:1/x?q=1", "u", "p")
    assert split_userinfo("http://h:1") == ("http://h:1", None, None)
    assert split_userinfo("http://u@h") == ("http://h", "u", None)


def test_redact_files_rewrites_only_files_holding_a_credential(tmp_path):
    hydra = tmp_path / ".hydra"
    hydra.mkdir()
    (hydra / "overrides.yaml").write_text(f"- tracking.uri=http://me:{PASSWORD}@127.0.0.1:5000\n- model=tiny\n")
    (hydra / "config.yaml").write_text("model:\n  name: tiny\n")
    before = (hydra / "config.yaml").stat().st_mtime_ns
    redact_files([hydra, tmp_path / "absent.yaml"])
    assert (hydra / "overrides.yaml").read_text() == "- tracking.uri=http://me:***@127.0.0.1:5000\n- model=tiny\n"
    assert (hydra / "config.yaml").stat().st_mtime_ns == before
