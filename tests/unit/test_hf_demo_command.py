"""`trainlab hf-demo DIR` with a DIR or option it cannot use, a write that fails, and a stop signal:
one `error:` (or `interrupted`) line, no traceback, nothing of the user's changed, nothing of its
own left behind, and the same command works next time.

The real command runs in a subprocess for a sample (a refusal, a bad --seed, Ctrl-C); the rest
calls its main() in-process, most with the tokenizer and model stood in for by a few files
(hf_demo_command._build), since what is checked is the folder around them.
"""

from __future__ import annotations

import errno
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import read_only_dir
from trainlab import hf_demo_command


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainlab.cli", "hf-demo", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def _main(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        hf_demo_command.main(list(args))
    got = capsys.readouterr()
    return e.value.code, got.out, got.err


def _one_error(code: int, err: str, *says: str) -> None:
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err, err
    for s in says:
        assert s in err, (s, err)


def _listing(folder: Path) -> dict[str, bytes | None]:
    """Every path under `folder` (links not followed) with a file's bytes."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(root, name)
            out[str(p.relative_to(folder))] = p.read_bytes() if p.is_file() and not p.is_symlink() else None
    return out


@pytest.fixture
def fast_build(monkeypatch):
    """The tokenizer, model and datasets as three small files (the folder logic is what is tested);
    `fail` set to an exception raises it after the first file is written."""
    class Build:
        fail: BaseException | None = None

        def __call__(self, folder: Path, *, family, seed, say):
            (folder / "model").mkdir()
            (folder / "model" / "config.json").write_text(f'{{"family": "{family}", "seed": {seed}}}')
            if self.fail is not None:
                raise self.fail
            (folder / "data").mkdir()
            (folder / "data" / "docs.jsonl").write_text('{"text": "x"}\n')
            (folder / "data" / "chat.jsonl").write_text('{"messages": []}\n')

    build = Build()
    monkeypatch.setattr(hf_demo_command, "_build", build)
    return build


# ---- through the real command -----------------------------------------------------------------
def test_cli_refuses_a_dir_it_cannot_make_in_one_line(tmp_path):
    """/proc takes no new folders: FileNotFoundError's traceback before."""
    got = _cli("/proc/trainlab-hf-demo", cwd=tmp_path)
    _one_error(got.returncode, got.stderr, "hf-demo DIR '/proc/trainlab-hf-demo'", "cannot make a folder in '/proc'",
               "name a new folder")
    assert got.stdout == "" and not os.path.lexists("/proc/trainlab-hf-demo")


@pytest.mark.parametrize("seed", ["99999999999999999999999", "-1", "1.5", "4294967296"])
def test_cli_refuses_a_seed_out_of_range_in_one_line(tmp_path, seed):
    """torch.manual_seed's overflow traceback (after DIR was half made) and argparse's usage block before."""
    got = _cli("demo", "--seed", seed, cwd=tmp_path)
    _one_error(got.returncode, got.stderr, "--seed", repr(seed), "from 0 to 4294967295", "--seed 0")
    assert list(tmp_path.iterdir()) == []


def _start(tmp_path: Path, name: str) -> subprocess.Popen:
    """The real command, started as a shell starts it (Ctrl-C and SIGHUP at their defaults), once
    its temporary folder exists (it is writing)."""
    proc = subprocess.Popen([sys.executable, "-c", (
        "import os, signal, sys; [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGHUP)]; "
        "os.execv(sys.executable, [sys.executable, '-m', 'trainlab.cli', *sys.argv[1:]])"), "hf-demo", name],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(p.name.startswith(f".{name}.hf-demo-") for p in tmp_path.iterdir()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no temporary folder within 120 s"
        time.sleep(0.02)
    return proc


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_run_leaves_nothing_and_the_next_one_works(tmp_path, sig, monkeypatch, fast_build):
    """Ctrl-C was a KeyboardInterrupt traceback (SIGTERM: no line at all) and left a half-made DIR
    that the same command then refused as not empty."""
    proc = _start(tmp_path, "demo")
    time.sleep(0.3)  # into the tokenizer's training
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    by = "" if sig == signal.SIGINT else f" by {sig.name}"
    assert proc.returncode == 128 + sig, (proc.returncode, out, err)
    assert err == f"interrupted{by}: nothing was written to 'demo'; run the same command again to make the demo\n"
    assert list(tmp_path.iterdir()) == []

    monkeypatch.chdir(tmp_path)  # the next run, in-process (the real build: test_the_demo_is_made_and_...)
    hf_demo_command.main(["demo"])
    assert sorted(_listing(tmp_path / "demo")) == ["data", "data/chat.jsonl", "data/docs.jsonl", "model",
                                                    "model/config.json"]


@pytest.mark.slow
def test_the_demo_is_made_and_its_sweep_reads_back(tmp_path):
    """The real build into a DIR with a space, comma, brackets and a quote: the model loads with its
    tokenizer, and the suggested sweep's paths reach Hydra as they are (they were printed bare)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = "my demo,é=[1]'s"
    got = _cli(name, "--seed", "7", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert [p.name for p in tmp_path.iterdir()] == [name]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / name / "model", local_files_only=True)
    assert model.config.vocab_size == len(AutoTokenizer.from_pretrained(tmp_path / name / "model"))
    sweep = shlex.split(got.stdout.split("next, a sweep on it:\n")[1])
    values = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(sweep[3:])}
    assert values["model.pretrained"] == values["data.tokenizer"] == f"{name}/model"
    assert values["data.path"] == f"{name}/data/docs.jsonl"


# ---- in-process -------------------------------------------------------------------------------
def test_an_immutable_parent_is_refused_in_one_line(tmp_path, capsys):
    parent = tmp_path / "locked"
    with read_only_dir(parent) as locked:
        if not locked:
            pytest.skip("cannot make a folder unwritable here (chattr +i)")
        code, out, err = _main(capsys, str(parent / "demo"))
        _one_error(code, err, f"hf-demo DIR '{parent / 'demo'}'", f"cannot make a folder in '{parent}'",
                   "in one you can write")
        assert out == "" and list(parent.iterdir()) == []


def test_a_dir_under_a_file_is_refused_and_the_file_kept(tmp_path, capsys):
    (tmp_path / "notes").write_text("mine")
    code, _, err = _main(capsys, str(tmp_path / "notes" / "demo"))
    _one_error(code, err, f"'{tmp_path / 'notes'}' is not a folder", "name a new folder")
    assert _listing(tmp_path) == {"notes": b"mine"}


def test_a_dangling_link_is_refused_and_kept(tmp_path, capsys):
    """It was followed: FileExistsError's traceback from mkdir."""
    (tmp_path / "demo").symlink_to("elsewhere")
    code, _, err = _main(capsys, str(tmp_path / "demo"))
    _one_error(code, err, "is a symbolic link to 'elsewhere', which does not exist",
               "make the folder it points to")
    assert os.readlink(tmp_path / "demo") == "elsewhere" and _listing(tmp_path) == {"demo": None}


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_file_or_a_folder_with_something_in_it_is_left_as_it_was(tmp_path, capsys, what, fast_build):
    demo = tmp_path / "demo"
    if what == "file":
        demo.write_text("mine")
    else:
        demo.mkdir()
        (demo / "model").write_text("mine")
    before = _listing(tmp_path)
    code, _, err = _main(capsys, str(demo))
    _one_error(code, err, f"hf-demo DIR '{demo}' exists and is",
               "a file" if what == "file" else "not empty (1 entry, e.g. 'model')", "name a new folder")
    assert _listing(tmp_path) == before


def _safetensor_error():
    from safetensors import SafetensorError

    return SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "config.json"),
                                   _safetensor_error()], ids=["os", "safetensors"])
def test_a_full_disk_leaves_nothing_and_the_next_run_works(tmp_path, capsys, fast_build, error):
    """Both ways a full disk surfaces (safetensors' own error for the weights): a traceback and a
    half-made DIR, which also made the next run refuse, before. The parents it made go too."""
    fast_build.fail = error
    demo = tmp_path / "new" / "demo"
    code, _, err = _main(capsys, str(demo))
    _one_error(code, err, f"hf-demo DIR '{demo}': writing the demo failed", "No space left on device",
               "nothing was kept")
    assert list(tmp_path.iterdir()) == []

    fast_build.fail = None
    hf_demo_command.main([str(demo)])
    assert (demo / "data" / "docs.jsonl").is_file() and [p.name for p in tmp_path.iterdir()] == ["new"]


def test_an_empty_folder_or_a_link_to_one_is_filled_and_kept(tmp_path, fast_build):
    """An existing empty DIR was filled in place before; it still is (same folder, the link stays)."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    inode = (tmp_path / "real").stat().st_ino
    hf_demo_command.main([str(tmp_path / "link"), "--seed", "3"])
    assert os.readlink(tmp_path / "link") == "real" and (tmp_path / "real").stat().st_ino == inode
    assert (tmp_path / "real" / "model" / "config.json").read_text() == '{"family": "llama", "seed": 3}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]  # no temporary folder left
