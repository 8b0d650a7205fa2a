"""Every file the CLI reads from a user's path (a calibration, a token file, a spill file, a
checkpoint's metadata, a trial record) is refused in one line when it is a FIFO, a character
device, a directory or bigger than such a file may be: no hang, no read of gigabytes, no
IsADirectoryError traceback (issue 28: reads)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from trainlab.vocab import files

TIMEOUT_S = 5


class Hung(BaseException):
    """The read did not come back."""


@contextlib.contextmanager
def within(seconds: float):
    """Fail (instead of hanging the suite) when the body blocks: SIGALRM interrupts a blocked
    open() or read() of a FIFO, and the handler's exception propagates (PEP 475)."""
    def hung(*_):  # not an OSError (TimeoutError is one): no `except OSError` may turn it into a refusal
        raise Hung(f"still reading after {seconds} s: the read blocks or never ends")

    old = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _fifo(tmp_path: Path, name: str) -> Path:
    p = tmp_path / name
    os.mkfifo(p)
    return p


def _sparse(tmp_path: Path, name: str, size: int) -> Path:
    p = tmp_path / name
    with open(p, "wb") as f:
        f.truncate(size)  # no blocks written: the size alone is what must be refused
    return p


# ------------------------------------------------------------------------------- the readers
def _calibration(path: Path):
    from trainlab.estimate.calibration import load_calibration

    return load_calibration(str(path))


def _calibration_of_run(path: Path):
    from trainlab.config.schema import ClusterConfig, RunConfig
    from trainlab.estimate.fit_check import calibration_of

    return calibration_of(RunConfig(cluster=ClusterConfig(calibration=str(path))))


def _tokens(path: Path):
    from trainlab.data.token_file import open_token_file

    return open_token_file(str(path), dtype="uint16", vocab_size=100)


def _spill(path: Path):
    from trainlab.tracking.spill import Spill

    return Spill(str(path)).check()


def _checkpoint_meta(path: Path):
    from trainlab.engine.resume import check_checkpoint

    return check_checkpoint(path.parent)


READERS = {
    # name: (reader, the file name the reader takes, what its message names, the bound)
    "calibration": (_calibration, "calibration.json", "cluster.calibration=", files.CONFIG_FILE_MAX_BYTES),
    "calibration_of_run": (_calibration_of_run, "calibration.json", "cluster.calibration=",
                           files.CONFIG_FILE_MAX_BYTES),
    "token_file": (_tokens, "tokens.bin", "data.path=", None),
    "spill_file": (_spill, "mlflow_spill.jsonl", "import-spill", None),
    "checkpoint_meta": (_checkpoint_meta, "trainlab.json", "checkpoint", files.CONFIG_FILE_MAX_BYTES),
}


def _bound(name: str) -> int:
    from trainlab.data.token_file import TOKEN_FILE_MAX_BYTES
    from trainlab.tracking.spill import SPILL_MAX_BYTES

    return READERS[name][3] or {"token_file": TOKEN_FILE_MAX_BYTES, "spill_file": SPILL_MAX_BYTES}[name]


def _refused(name: str, path: Path, *, says: str) -> str:
    reader, _, field, _ = READERS[name]
    with within(TIMEOUT_S), pytest.raises(ValueError) as e:
        reader(path)
    message = str(e.value)
    assert "\n" not in message, message
    named = path.parent if name == "checkpoint_meta" else path  # the checkpoint, then its file's name
    assert field in message and str(named) in message, message
    assert says in message, message
    return message


@pytest.mark.parametrize("name", READERS)
def test_a_fifo_is_refused_without_waiting_for_a_writer(name, tmp_path):
    where = tmp_path / "step_00000010" if name == "checkpoint_meta" else tmp_path
    where.mkdir(exist_ok=True)
    _refused(name, _fifo(where, READERS[name][1]), says="FIFO")


@pytest.mark.parametrize("name", [n for n in READERS if n != "checkpoint_meta"])
def test_dev_zero_is_refused_before_a_byte_is_read(name):
    _refused(name, Path("/dev/zero"), says="character device")


@pytest.mark.parametrize("name", READERS)
def test_a_directory_is_refused_as_such(name, tmp_path):
    where = tmp_path / "step_00000010" if name == "checkpoint_meta" else tmp_path
    (where / READERS[name][1]).mkdir(parents=True)
    _refused(name, where / READERS[name][1], says="a directory")


@pytest.mark.parametrize("name", READERS)
def test_an_oversized_file_is_refused_by_its_size(name, tmp_path):
    where = tmp_path / "step_00000010" if name == "checkpoint_meta" else tmp_path
    where.mkdir(exist_ok=True)
    _refused(name, _sparse(where, READERS[name][1], _bound(name) + 2), says="more than the")


def test_a_trial_record_that_is_a_fifo_is_no_record(tmp_path):
    """The run recorded beside the checkpoints: a FIFO there is read as 'no record', not waited on."""
    from trainlab.tracking.continued_run import TRIAL_RECORD, recorded_trial

    _fifo(tmp_path, TRIAL_RECORD)
    with within(TIMEOUT_S):
        assert recorded_trial(tmp_path, "sqlite:///nowhere.db") is None


def test_the_helper_refuses_a_fifo_swapped_in_after_the_check(tmp_path, monkeypatch):
    """open_file checks the descriptor it opened (O_NONBLOCK): a FIFO that replaced the file
    between the stat and the open is refused, not waited on."""
    real = tmp_path / "real.json"
    real.write_text("{}")
    fifo = _fifo(tmp_path, "swapped")
    monkeypatch.setattr(files, "check_file", lambda *a, **k: 0)  # the race: the first check saw a file
    with within(TIMEOUT_S), pytest.raises(files.InputFileError, match="FIFO"):
        files.read_text(fifo, field="x", fix="fix it")


def test_a_file_that_grows_past_its_bound_while_read_is_refused(tmp_path):
    """/proc files say size 0 and hold more: the read itself stops at the bound."""
    with pytest.raises(files.InputFileError, match="grew past"):
        files.read_bytes("/proc/self/maps", field="x", fix="fix it", max_bytes=16)


def test_a_missing_calibration_says_so_once(tmp_path):
    message = _refused("calibration_of_run", tmp_path / "absent.json", says="does not exist")
    assert message.count(str(tmp_path / "absent.json")) == 1, message  # not wrapped in a second message


def test_a_good_calibration_still_loads(tmp_path):
    from trainlab.estimate.calibration import Calibration

    p = tmp_path / "calibration.json"
    Calibration().save(p)
    assert _calibration(p).source == str(p)
    assert json.loads(p.read_text())


def test_a_good_token_file_still_maps(tmp_path):
    from trainlab.data.token_file import write_token_file

    p = write_token_file(tmp_path / "t.bin", np.arange(64) % 100, "uint16")
    assert len(_tokens(p)) == 64


# ------------------------------------------------------------------------ the user's YAML files
@pytest.mark.parametrize("kind", ["fifo", "directory", "oversized"])
def test_a_config_tree_yaml_that_is_no_file_is_refused_before_hydra_reads_it(kind, tmp_path, monkeypatch):
    """A sweep file (sweeps/sweep/NAME.yaml) or a group option that is a FIFO would hang Hydra's
    compose; one that is a directory or huge fails inside it. Refused first, naming the file."""
    from trainlab.config import ConfigError, convert
    from trainlab.config.overrides import check_overrides

    sweeps = tmp_path / "sweeps"
    shutil.copytree(convert.SWEEPS_DIR, sweeps)  # the real sweeps, and one more beside them
    bad = sweeps / "sweep" / "stuck.yaml"
    if kind == "fifo":
        os.mkfifo(bad)
    elif kind == "directory":
        bad.mkdir()
    else:
        _sparse(sweeps / "sweep", "stuck.yaml", files.CONFIG_FILE_MAX_BYTES + 1)
    monkeypatch.setattr(convert, "SWEEPS_DIR", sweeps)
    with within(TIMEOUT_S * 4), pytest.raises(ConfigError) as e:
        check_overrides(["-m", "+sweep=stuck"])
    message = str(e.value)
    assert "\n" not in message and str(bad) in message, message
    assert {"fifo": "FIFO", "directory": "a directory", "oversized": "more than the"}[kind] in message, message


# ------------------------------------------------------------------------ a token file's dtype
@pytest.mark.parametrize("written, read, fix", [
    ("int32", "uint16", "data.token_dtype=int32"),
    ("uint32", "uint16", "data.token_dtype=int32"),
    ("uint16", "uint8", "data.token_dtype=uint16"),
])
def test_a_token_file_read_with_too_narrow_a_dtype_is_refused_naming_the_dtype(written, read, fix, tmp_path):
    """int32 ids below 65536 read as uint16 are all inside the vocabulary: every second one is the
    zero high half of the one before. Training on that would learn from misread ids."""
    from trainlab.data.token_file import open_token_file, write_token_file

    ids = np.random.default_rng(0).integers(1, 200, size=4096)
    path = write_token_file(tmp_path / "t.bin", ids, written)
    with pytest.raises(ValueError) as e:
        open_token_file(str(path), dtype=read, vocab_size=70_000)
    message = str(e.value)
    assert f"data.token_dtype={read}" in message and fix in message and str(path) in message, message


def test_a_npy_file_is_refused_as_such(tmp_path):
    """np.save writes a header the raw reader would take for token ids."""
    from trainlab.data.token_file import open_token_file

    path = tmp_path / "t.npy"
    np.save(path, (np.arange(4096) % 100).astype(np.uint16))
    with pytest.raises(ValueError, match=r"\.npy.*tofile"):
        open_token_file(str(path), dtype="uint16", vocab_size=70_000)


def test_a_token_file_read_with_its_own_dtype_still_opens(tmp_path):
    from trainlab.data.token_file import open_token_file, write_token_file

    ids = np.random.default_rng(0).integers(0, 200, size=4096)
    for dtype in ("uint8", "uint16", "int32", "uint32"):
        path = write_token_file(tmp_path / f"{dtype}.bin", ids, dtype)
        assert (open_token_file(str(path), dtype=dtype, vocab_size=256)[:] == ids).all()


def test_train_refuses_a_calibration_that_is_no_file_before_anything_starts(tmp_path):
    """`trainlab train` only warned ('no estimate of the trial') and went on; a calibration the
    user named that cannot be read is bad input like any other: refused in preflight."""
    from trainlab.config import ConfigError
    from trainlab.config.schema import ClusterConfig, RunConfig
    from trainlab.launch.preflight import preflight

    fifo = _fifo(tmp_path, "calibration.json")
    run = RunConfig(output_dir=str(tmp_path / "out"), cluster=ClusterConfig(calibration=str(fifo)))
    with within(TIMEOUT_S), pytest.raises(ConfigError, match="cluster.calibration=.*FIFO"):
        preflight(run, tracking_uri=None, services=False)


@pytest.mark.parametrize("flag", ["--config-dir", "-cd", "--config-dir="])
def test_a_config_dir_from_the_command_line_is_checked_too(flag, tmp_path):
    """Hydra's --config-dir adds a folder of the user's YAML to the search path: its files are
    read like conf/'s, so they are checked like conf/'s."""
    from trainlab.config import ConfigError
    from trainlab.config.overrides import check_overrides

    os.mkfifo(tmp_path / "mine.yaml")
    args = [f"{flag}{tmp_path}"] if flag.endswith("=") else [flag, str(tmp_path)]
    with within(TIMEOUT_S), pytest.raises(ConfigError, match="mine.yaml.*FIFO"):
        check_overrides([*args, "model=tiny"])
