"""trainlab.launch.preflight: environment checks fail fast, before any worker starts, with a
message that names the field, the value and the fix. Only 127.0.0.1 is ever contacted."""

from __future__ import annotations

import os
import socket
import time

import numpy as np
import pytest
import torch

from conftest import closed_port, read_only_dir
from trainlab.config import ConfigError, compose_run_config
from trainlab.data import write_token_file
from trainlab.launch.preflight import (
    check_data,
    check_device,
    check_ray_address,
    check_tracking_uri,
    preflight,
)
from trainlab.precision.capability import (
    MIN_CUDA_CAPABILITY,
    check_precision_supported,
    cpu_rowwise_scaled_mm,
)
from trainlab.tracking.store import resolve_tracking_uri
from trainlab.vocab.precision import PRECISIONS, spec_of

BASE = ["model=tiny", "cluster.device=cpu", "tracking=none"]
# enough for a global batch of train.seq_len windows in train and a batch per rank in val
ENOUGH_TOKENS = np.arange(50_000) % 100


@pytest.fixture
def no_proxy(monkeypatch):
    """urllib honours *_proxy variables: make sure loopback URLs stay on loopback."""
    for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("NO_PROXY", "*")


def _tokens_run(path, vocab: int = 100, dtype: str = "uint16"):
    return compose_run_config(BASE + ["data=tokens", f"data.path={path}", f"data.vocab_size={vocab}",
                                      f"data.token_dtype={dtype}"])


# ---------------------------------------------------------------------------- data
def test_a_good_token_file_passes(tmp_path):
    path = write_token_file(tmp_path / "t.bin", ENOUGH_TOKENS, "uint16")
    assert preflight(_tokens_run(path), tracking_uri=None).device == "cpu"


def test_missing_token_file_names_data_path(tmp_path):
    missing = tmp_path / "nope.bin"
    with pytest.raises(ConfigError) as info:
        preflight(_tokens_run(missing), tracking_uri=None)
    assert "data.path" in str(info.value) and str(missing) in str(info.value)


def test_token_directory_is_not_a_file(tmp_path):
    with pytest.raises(ValueError, match="data.path"):
        check_data(_tokens_run(tmp_path))


def test_token_file_size_not_a_multiple_of_dtype(tmp_path):
    path = write_token_file(tmp_path / "t.bin", ENOUGH_TOKENS, "uint16")
    with path.open("ab") as f:
        f.write(b"\x00")
    with pytest.raises(ConfigError) as info:
        preflight(_tokens_run(path), tracking_uri=None)
    msg = str(info.value)
    assert "data.token_dtype=uint16" in msg and str(path.stat().st_size) in msg


def test_same_file_read_with_the_wrong_dtype_is_caught(tmp_path):
    # an odd number of uint8 tokens: fine as uint8, not as int32
    path = write_token_file(tmp_path / "t.bin", ENOUGH_TOKENS[:-1], "uint8")
    check_data(_tokens_run(path, dtype="uint8"))
    with pytest.raises(ValueError, match="int32"):
        check_data(_tokens_run(path, dtype="int32"))


# ---------------------------------------------------------------------------- ray address
def test_unreachable_ray_address_fails_fast():
    address = f"127.0.0.1:{closed_port()}"
    run = compose_run_config(BASE + [f"cluster.address={address}", "cluster.start_timeout_s=10"])
    start = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        preflight(run, tracking_uri=None)
    assert time.perf_counter() - start < 5
    msg = str(info.value)
    assert "cluster.address" in msg and address in msg and "ray start --head" in msg


def test_unreachable_ray_client_address_uses_its_port():
    port = closed_port()
    with pytest.raises(ValueError, match=f"127.0.0.1:{port}"):
        check_ray_address(f"ray://127.0.0.1:{port}", timeout_s=2)


def test_dashboard_url_suggests_ray_job_submit():
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(ValueError) as info:
        check_ray_address(url, timeout_s=2)
    msg = str(info.value)
    assert "cluster.address" in msg and "ray job submit" in msg and url in msg


def test_auto_address_without_a_cluster_on_this_node_fails_fast(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # where Ray looks for ray/ray_current_cluster
    with pytest.raises(ValueError, match=r"cluster.address='auto'.*ray start --head"):
        check_ray_address("auto", timeout_s=0.01)


def test_auto_address_with_ray_address_set_checks_that_address(monkeypatch, tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{server.getsockname()[1]}")
        check_ray_address("auto", timeout_s=2)


def test_a_listening_ray_address_passes():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        check_ray_address(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=2)


# ---------------------------------------------------------------------------- tracking store
@pytest.mark.parametrize("uri", [
    "sqlite:////proc/nonexistent/mlflow.db",  # cannot be created, even by root
    "sqlite:////proc/self/mlflow.db",          # exists, but no file can be written there
    "file:///proc/nonexistent/mlruns",
])
def test_unwritable_tracking_store(uri):
    run = compose_run_config(BASE)
    with pytest.raises(ConfigError) as info:
        preflight(run, tracking_uri=uri)
    msg = str(info.value)
    assert "tracking.uri" in msg and uri in msg and "tracking=none" in msg


def test_read_only_tracking_folder(tmp_path):
    """A folder its user cannot write: mode 0o500, and for root (whom modes do not stop, and
    who runs CI) also the immutable attribute."""
    folder = tmp_path / "ro"
    with read_only_dir(folder) as locked:
        if not locked:
            pytest.skip("cannot make a folder read-only for root here (no chattr +i); "
                        "test_tracking_store_under_a_file covers the refusal for root")
        with pytest.raises(ValueError) as info:
            check_tracking_uri(f"sqlite:///{folder}/mlflow.db")
    msg = str(info.value)
    assert f"tracking.uri='sqlite:///{folder}/mlflow.db' cannot be written" in msg and "tracking=none" in msg
    assert ("Permission denied" if os.geteuid() else "Operation not permitted") in msg, msg
    assert list(folder.iterdir()) == []  # no store and no probe left behind


@pytest.mark.parametrize("form", ["sqlite:///{file}/mlflow.db", "sqlite:///{file}/sub/mlflow.db",
                                  "file://{file}/mlruns", "file://{file}"])
def test_tracking_store_under_a_file(tmp_path, form):
    """A store whose folder is a regular file cannot be made by anyone, root included (ENOTDIR,
    no permissions needed): refused, saying why ('Not a directory', not mkdir's 'File exists')."""
    file = tmp_path / "notes.txt"
    file.write_text("not a folder")
    uri = form.format(file=file)
    with pytest.raises(ValueError) as info:
        check_tracking_uri(uri)
    msg = str(info.value)
    assert f"tracking.uri={uri!r} cannot be written (Not a directory: {file}" in msg, msg
    assert "tracking=none" in msg
    assert file.read_text() == "not a folder" and list(tmp_path.iterdir()) == [file]


def test_unreachable_tracking_server(no_proxy):
    uri = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(ConfigError) as info:
        preflight(compose_run_config(BASE), tracking_uri=uri)
    msg = str(info.value)
    assert "tracking.uri" in msg and uri in msg and "mlflow server" in msg


def test_writable_sqlite_store_passes_and_leaves_no_probe(tmp_path):
    db = tmp_path / "mlflow.db"
    assert preflight(compose_run_config(BASE), tracking_uri=f"sqlite:///{db}").device == "cpu"
    assert list(tmp_path.iterdir()) == []  # the check wrote nothing it did not clean up


# ---------------------------------------------------------------------------- device, precision
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_on_a_cpu_only_machine():
    with pytest.raises(ConfigError) as info:
        preflight(compose_run_config(["model=tiny", "cluster.device=cuda"]), tracking_uri=None)
    assert "cluster.device=cuda" in str(info.value) and "cluster.device=cpu" in str(info.value)


def test_auto_device_resolves_to_what_torch_sees():
    run = compose_run_config(["model=tiny", "cluster.device=auto", "cluster.num_workers=1"])
    assert check_device(run) == ("cuda" if torch.cuda.is_available() else "cpu")


def test_bf16_on_a_pre_ampere_gpu():
    with pytest.raises(ValueError) as info:
        check_precision_supported("bf16", device="cuda", capability=(7, 0), device_name="Tesla V100")
    msg = str(info.value)
    assert "precision=bf16" in msg and "7.0" in msg and "8.0" in msg
    assert "Tesla V100" in msg and "precision=fp16" in msg


@pytest.mark.parametrize("precision", ["bf16", "bf16_pure", "fp16", "fp32"])
def test_ampere_runs_every_precision(precision):
    check_precision_supported(precision, device="cuda", capability=(8, 0), device_name="A100")


@pytest.mark.parametrize("precision", sorted(MIN_CUDA_CAPABILITY))
def test_every_precision_runs_on_cpu(precision):
    check_precision_supported(precision, device="cpu", emulated=True)
    if not spec_of(precision).torchao_recipe.startswith("rowwise") or cpu_rowwise_scaled_mm():
        check_precision_supported(precision, device="cpu")  # natively (test_fp8: the refusal)


def test_unknown_precision_is_refused_on_both_devices():
    with pytest.raises(ValueError, match="fp9"):
        check_precision_supported("fp9", device="cpu")
    with pytest.raises(ValueError, match="fp9"):
        check_precision_supported("fp9", device="cuda", capability=(9, 0))


def test_capability_table_covers_every_precision():
    assert set(PRECISIONS) <= set(MIN_CUDA_CAPABILITY)
    for precision, need in MIN_CUDA_CAPABILITY.items():
        assert len(need) == 2 and all(isinstance(v, int) for v in need), precision


# ---------------------------------------------------------------------------- tracking uri
def test_explicit_tracking_uri_wins(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    assert resolve_tracking_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


def test_env_tracking_uri_wins_over_the_default(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert resolve_tracking_uri("") == "http://127.0.0.1:5000"


def test_default_tracking_uri_is_an_absolute_sqlite_db_in_the_cwd(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    uri = resolve_tracking_uri("")
    assert uri == "sqlite:///" + str(tmp_path.resolve() / "mlflow.db")
    assert os.path.isabs(uri[len("sqlite:///"):])


def test_relative_sqlite_uri_is_made_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert resolve_tracking_uri("sqlite:///runs/m.db") == "sqlite:///" + str(tmp_path.resolve() / "runs" / "m.db")


# issue 28: refusals
def test_a_model_larger_than_this_machine_is_refused_before_ray_with_the_numbers(tmp_path):
    """The driver's preflight (before Ray starts) estimates a local trial against this host's
    memory: model.n_layers=10000 model.dim=1000000 used to be a warning, then a 4 TB allocation."""
    from trainlab.estimate.hardware import host_memory_gb

    run = compose_run_config(BASE + ["model.n_layers=10000", "model.dim=1000000", "cluster.num_workers=2",
                                     f"output_dir={tmp_path}"])
    with pytest.raises(ConfigError) as e:
        preflight(run, tracking_uri=None, services=False)
    msg = str(e.value)
    assert f"hold {host_memory_gb():,.1f} GB together" in msg, msg  # this host's memory, shared by its ranks
    assert "model.n_layers=10000 model.dim=1000000" in msg and "fix: a smaller model" in msg, msg


def test_a_model_larger_than_this_machine_by_its_estimate_is_refused_before_ray(tmp_path):
    """Weights that would fit, a trial that would not (model=7b on a CPU host): the plan's
    estimate refuses it in preflight, where it used to be a warning."""
    from trainlab.estimate.hardware import host_memory_gb

    run = compose_run_config(BASE + ["model=7b", "cluster.num_workers=2", f"output_dir={tmp_path}"])
    if host_memory_gb() > 200:
        pytest.skip("this host could hold a 7B trial")
    with pytest.raises(ConfigError, match=r"rank \d needs [\d.]+ GB .* its cpu holds [\d.]+ GB .*fix: .*parallel=fsdp"):
        preflight(run, tracking_uri=None, services=False)


def test_a_model_that_fits_this_machine_passes_preflight(tmp_path):
    run = compose_run_config(BASE + ["cluster.num_workers=2", f"output_dir={tmp_path}"])
    assert preflight(run, tracking_uri=None, services=False).device == "cpu"


def test_a_sweep_holding_a_trial_too_large_for_this_machine_is_refused_whole(tmp_path):
    from trainlab.launch.preflight import check_sweep_trials

    ok = compose_run_config(BASE + [f"output_dir={tmp_path}"])
    huge = compose_run_config(BASE + ["model.n_layers=10000", "model.dim=1000000", f"output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"nothing was started:\n  #1 \(model.n_layers=10000\): model.n_layers=10000"):
        check_sweep_trials([ok, huge], ["#0 (default)", "#1 (model.n_layers=10000)"])
    check_sweep_trials([ok, ok], ["#0", "#1"])


def test_a_markov_corpus_larger_than_this_machine_is_refused_with_the_most_it_holds(tmp_path):
    """data.num_tokens=1e12 used to start Ray, then fail (or swap) generating a terabyte per worker."""
    run = compose_run_config(BASE + ["data=markov", "data.num_tokens=1000000000000", f"output_dir={tmp_path}"])
    with pytest.raises(ValueError, match=r"data.num_tokens=1000000000000: .* GB .* holds [\d,.]+ GB; "
                                         r"lower it to data.num_tokens=\d+ at most") as e:
        check_data(run)
    most = int(str(e.value).rsplit("data.num_tokens=", 1)[1].split()[0])  # pasted as it is printed
    fixed = compose_run_config(BASE + ["data=markov", f"data.num_tokens={most}", f"output_dir={tmp_path}"])
    check_data(fixed)  # the fix it names passes


@pytest.fixture(scope="module")
def store_with_a_deleted_experiment(tmp_path_factory):
    """A real sqlite store (made once: MLflow's migrations take seconds) holding 'gone', deleted."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    client.delete_experiment(client.create_experiment("gone"))
    client.create_experiment("here")
    return uri


def test_a_deleted_experiment_is_refused_before_ray_naming_restore_or_another_name(store_with_a_deleted_experiment,
                                                                                    tmp_path):
    """tracking.experiment=X with X soft-deleted used to crash after Ray had started (MLflow will not
    make an experiment whose name a deleted one holds)."""
    uri = store_with_a_deleted_experiment
    run = compose_run_config(["model=tiny", "cluster.device=cpu", f"tracking.uri={uri}", "tracking.experiment=gone",
                              f"output_dir={tmp_path}"])
    with pytest.raises(ConfigError) as e:
        preflight(run, tracking_uri=uri)
    msg = str(e.value)
    assert "tracking.experiment='gone'" in msg and "deleted" in msg, msg
    assert f"MLFLOW_TRACKING_URI={uri} mlflow experiments restore --experiment-id 1" in msg, msg
    assert "tracking.experiment=gone_2" in msg, msg  # another name, free in the store
    for name in ("here", "new"):
        ok = compose_run_config(["model=tiny", "cluster.device=cpu", f"tracking.uri={uri}",
                                 f"tracking.experiment={name}", f"output_dir={tmp_path}"])
        assert preflight(ok, tracking_uri=uri).device == "cpu"
