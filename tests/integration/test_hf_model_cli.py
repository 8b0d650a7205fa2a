"""`trainlab train model=hf` with a model folder gone wrong, through the real CLI: a folder naming its
own code to run (answered "y" on stdin, as a user at transformers' prompt would), weights cut
short, an activation transformers does not know. Each exits 2 with one `error:` line naming the
folder and the fix, no traceback, no prompt, no Ray session, and the folder's code never runs.
The details of each refusal are in tests/unit/test_hf_model_inputs.py."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import assert_refused, trainlab_cmd
from trainlab.models.hf_demo import write_demo_model

RUN = ["data=text", "train.max_steps=2", "train.seq_len=32", "train.global_batch_size=4", "train.micro_batch_size=2",
       "cluster.num_workers=1", "tracking=none"]


def _spoil(folder: Path, case: str, marker: Path) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    if case == "own_code":
        cfg |= {"model_type": "evilnet", "auto_map": {"AutoConfig": "evil.EvilConfig",
                                                      "AutoModelForCausalLM": "evil.EvilModel"}}
        (folder / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    elif case == "cut_short":
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-4096])
    elif case == "activation":
        cfg["hidden_act"] = "bogus"
    (folder / "config.json").write_text(json.dumps(cfg))


CASES = {
    "own_code": ["model_type='evilnet'", "auto_map", "never runs a model folder's own code"],
    "cut_short": ["model.safetensors in", "is cut short: its header places tensor", "copy the model folder again"],
    "activation": ['has hidden_act="bogus", an activation transformers does not know', "silu"],
}


def _train(work: Path, case: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_", "HYDRA_"))}
    with tempfile.TemporaryDirectory(prefix="tlhfm-") as ray_tmp:
        env |= {"RAY_TMPDIR": ray_tmp, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        proc = subprocess.run(trainlab_cmd("train", "model=hf", f"model.pretrained={case}", *RUN,
                                           f"output_dir=out_{case}"),
                              cwd=work, env=env, input="y\n", capture_output=True, text=True, timeout=600)
        return proc, [str(p) for p in Path(ray_tmp).rglob("session_*")]


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """Each case's folder spoilt from the demo model, run one after another (each is a Python start-up
    that imports torch and transformers: a few seconds)."""
    work = tmp_path_factory.mktemp("hfmodelcli")
    marker = work / "the_folder_ran_its_code"
    for case in CASES:
        _spoil(write_demo_model(work / case, family="llama", vocab_size=300), case, marker)
    results = {case: _train(work, case) for case in CASES}
    return work, marker, results


@pytest.mark.parametrize("case", CASES)
def test_a_spoilt_model_folder_is_refused_before_ray_in_one_line(refused, case):
    work, marker, results = refused
    proc, sessions = results[case]
    assert_refused(proc, [str(work / case), *CASES[case]], sessions=sessions)
    assert "[y/N]" not in proc.stdout + proc.stderr and "custom code" not in proc.stdout + proc.stderr
    assert not marker.exists(), "the model folder's own code ran"
    assert not (work / f"out_{case}").exists() or not any((work / f"out_{case}").iterdir())
