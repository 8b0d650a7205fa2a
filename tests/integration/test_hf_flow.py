"""The README's three commands for your own model and data, as a user runs them: make a local
model and dataset (`trainlab hf-demo`), sweep precision x layout on it with `-m` (fine-tuning its
weights, each trial exporting what it trained), compare; then the winner's model, fetched from its
MLflow run with MLflow's own CLI, loads into transformers and generates."""

from __future__ import annotations

import csv
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import trainlab_cmd
from doc_commands import HF, HF_PAGE, find, section_commands

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _run(args: list[str], *, cwd, timeout=900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(PYTHONUNBUFFERED="1", COLUMNS="250", HF_HUB_OFFLINE="1")
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_sweep_your_model_compare_and_load_the_winner(tmp_path, mlflow_db, joined_cluster):
    commands = section_commands(HF[1], page=HF[0])  # the README's three, as shown
    assert commands == section_commands(HF_PAGE[1], page=HF_PAGE[0])  # and the docs page's
    made = _run(trainlab_cmd(*find(commands, "trainlab", "hf-demo")[1:]), cwd=tmp_path)
    assert made.returncode == 0, made.stderr[-3000:]
    sweep = find(commands, "trainlab", "train", "-m")
    assert shlex.join(sweep) in made.stdout  # hf-demo suggests the same sweep
    # fewer steps than shown (each trial still evaluates and exports); the store in tmp_path
    args = [a for a in sweep[1:] if not a.startswith("train.max_steps")]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = _run(trainlab_cmd(*args, "train.max_steps=4", "train.eval_every=2", f"tracking.uri={uri}",
                               *joined_cluster.sweep(workers=2)), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.stdout.count("exported the trained model to") == 4

    cmp = _run(trainlab_cmd(*find(commands, "trainlab", "compare")[1:], "--out", str(tmp_path / "cmp"),
                            f"--tracking-uri={uri}"), cwd=tmp_path)
    assert cmp.returncode == 0, cmp.stdout[-3000:] + cmp.stderr[-3000:]
    rows = {r["label"] for r in csv.DictReader(open(tmp_path / "cmp" / "summary.csv"))}
    assert rows == {f"precision={p} parallel={d}" for p in ("fp32", "bf16") for d in ("ddp", "fsdp")}
    fetch = re.search(r"the winner's model \(train.export=hf\), for transformers' from_pretrained: (.*)$",
                      cmp.stdout, re.M).group(1)
    env_part, command = fetch.split(" ", 1)
    assert env_part == f"MLFLOW_TRACKING_URI={uri}"
    got = subprocess.run(shlex.split(command), cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "MLFLOW_TRACKING_URI": uri})
    assert got.returncode == 0, got.stderr[-2000:]

    load = _run([sys.executable, "-c", (
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "m = AutoModelForCausalLM.from_pretrained('winner/hf_model', local_files_only=True)\n"
        "t = AutoTokenizer.from_pretrained('winner/hf_model', local_files_only=True)\n"
        "ids = t('The for statement', return_tensors='pt').input_ids\n"
        "out = m.generate(ids, max_new_tokens=5, do_sample=False)\n"
        "print('generated', out.shape[1] - ids.shape[1])\n")], cwd=tmp_path)
    assert "generated 5" in load.stdout, load.stdout[-2000:] + load.stderr[-2000:]
