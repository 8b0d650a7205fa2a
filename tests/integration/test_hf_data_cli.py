"""`trainlab train data=hf` end to end: a local chat dataset and tokenizer (data.hf_demo), tokenized
once by the driver's preflight, trained on a local Ray cluster with the loss on the answers only;
and a Hub name refused by the command before Ray starts, with nothing downloaded."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import assert_refused, trainlab_cmd
from trainlab import names
from trainlab.data.hf_demo import train_demo_tokenizer, write_demo_dataset

SMALL = ["model=tiny", "model.vocab_size=0", "train.seq_len=32", "train.global_batch_size=8",
         "train.micro_batch_size=4", "train.eval_batches=2", "cluster.num_workers=1", "tracking=none"]


def _train(cwd: Path, *args: str, timeout: float = 420) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`trainlab train ARGS` in `cwd` with its own RAY_TMPDIR, offline; (the process, Ray sessions)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_", "HYDRA_"))}
    with tempfile.TemporaryDirectory(prefix="tlhf-") as ray_tmp:  # short: Ray's socket paths live under it
        env |= {"RAY_TMPDIR": ray_tmp, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cwd / "hub"),
                "PYTHONUNBUFFERED": "1"}
        proc = subprocess.run(trainlab_cmd("train", *args), cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
        return proc, [str(p) for p in Path(ray_tmp).rglob("session_*")]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("hfwork")
    train_demo_tokenizer(work / "tok")
    write_demo_dataset(work / "data")
    return work


def test_a_hub_name_is_refused_before_ray_naming_how_to_make_a_local_copy(work):
    proc, sessions = _train(work, *SMALL, "data=hf", "data.path=HuggingFaceFW/fineweb", "data.tokenizer=tok")
    assert_refused(proc, ["data.path='HuggingFaceFW/fineweb' is not a path on this machine",
                          "trainlab downloads nothing", "hf download HuggingFaceFW/fineweb --repo-type dataset"],
                   sessions=sessions)


def test_a_damaged_data_file_is_refused_before_ray_naming_its_line_and_leaves_no_lock(work):
    """A folder of JSON lines, one file with a Latin-1 byte on its third line: the file, the line
    and the fix in one line; data.cache_dir is made but left empty (no lock file, no temporary)."""
    (work / "mixed").mkdir()
    (work / "mixed" / "a.jsonl").write_text("".join((work / "data" / "docs.jsonl").read_text().splitlines(True)[:20]))
    (work / "mixed" / "b.jsonl").write_bytes(b'{"text": "one"}\n{"text": "two"}\n{"text": "caf\xae"}\n')
    proc, sessions = _train(work, *SMALL, "data=hf", "data.path=mixed", "data.tokenizer=tok",
                            "data.cache_dir=refused_cache")
    assert_refused(proc, [f"data.path={str(work / 'mixed')!r}: 'b.jsonl' line 3 is not UTF-8 text (byte 0xae)",
                          "convert it to UTF-8 into a new file"], sessions=sessions)
    assert list((work / "refused_cache").iterdir()) == []


def test_a_cache_dir_that_is_a_file_is_refused_before_ray_and_left_as_it_was(work):
    (work / "notes.txt").write_text("mine")
    proc, sessions = _train(work, *SMALL, "data=hf", "data.path=data/docs.jsonl", "data.tokenizer=tok",
                            "data.cache_dir=notes.txt")
    assert_refused(proc, [f"data.cache_dir={str(work / 'notes.txt')!r} is a file, not a folder",
                          "set data.cache_dir to a folder you can write"], sessions=sessions)
    assert (work / "notes.txt").read_text() == "mine"


@pytest.mark.ray
@pytest.mark.slow
def test_chat_fine_tuning_on_answers_trains_on_ray(work, joined_cluster):
    """Relative paths, tokenized once by the driver (its progress line), read from the cache by the
    worker, 3 steps with finite losses."""
    cache = work / "cache"
    proc, _ = _train(work, *SMALL, "data=hf", "data.path=data/chat.jsonl", "data.tokenizer=tok",
                     "data.format=chat", "data.loss_on=answer", f"data.cache_dir={cache}", "train.max_steps=3",
                     "output_dir=out", *joined_cluster.run)
    shown = f"\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, shown
    assert "finished" in proc.stdout, shown
    assert (proc.stdout + proc.stderr).count("tokenizing data.path=") == 1, shown  # once, on the driver
    [folder] = [p for p in cache.iterdir() if p.is_dir()]
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["masked"] and 0 < meta["num_targets"] < meta["num_tokens"]
    lines = [json.loads(line) for line in next(Path(work / "out").rglob("metrics.jsonl")).read_text().splitlines()]
    losses = [rec[names.LOSS] for rec in lines if names.LOSS in rec]
    assert len(losses) == 3 and all(0 < v < 20 for v in losses), lines[-3:]
