"""Hostile input through the real CLI, the way a user runs it: `python -m trainlab.cli train ...`
in a subprocess. Every case must exit 2 with one `error:` line that names the field and the bad
value and says the fix, print no traceback, start no Ray session, and leave an existing MLflow
store (with a finished run in it) and a checkpoint directory byte-for-byte as they were.

Config-layer details (which message for which field) are in tests/unit; this table checks that
each kind of bad input stops the command cleanly before anything starts.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from trainlab.data import write_token_file

VOCAB = 100
TINY = ["model=tiny", "train.max_steps=2", "train.seq_len=32", "train.global_batch_size=4",
        "train.micro_batch_size=2", "cluster.num_workers=2", "tracking.experiment=bad_input"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    """After `train` and TINY; `{tokens}` etc. are filled in with the fixture's files."""
    says: tuple[str, ...]
    """Substrings stderr's `error:` line must hold: the field, the value, the fix."""
    skip: str = ""


def C(id: str, args: list[str], says: list[str], skip: str = "") -> Case:  # noqa: N802 - a table row
    return Case(id, tuple(args), tuple(says), skip)


CASES = [
    # ---------------------------------------------------------------- what Hydra refuses
    C("wrong_type", ["train.max_steps=abc"], ["train.max_steps=abc", "Integer", "train.max_steps=200"]),
    C("null_for_int", ["train.max_steps=null"], ["train.max_steps=null", "not Optional"]),
    C("unknown_key", ["train.nonsense=1"], ["train.nonsense=1", "no key 'nonsense'", "remove it"]),
    C("unknown_key_appended", ["+train.nonsense=1"], ["train.nonsense=1", "no key 'nonsense'"]),
    C("misspelt_key", ["train.max_stps=5"], ["train.max_stps=5", "did you mean train.max_steps?"]),
    C("unknown_option_precision", ["precision=fp64"], ["precision=fp64", "choose one of", "bf16", "fp32"]),
    C("unknown_option_model", ["model=huge"], ["model=huge", "choose one of", "tiny", "small"]),
    C("unknown_group", ["foo=bar"], ["foo=bar", "no key 'foo'"]),
    C("unknown_group_appended", ["+foo=bar"], ["foo=bar", "no key 'foo'"]),
    C("not_an_override", ["model"], ["'model'", "key=value"]),
    C("sweep_without_multirun", ["seed=1,2"], ["seed=1,2", "--multirun"]),
    C("bad_value_in_a_sweep", ["-m", "precision=fp32,fp64"], ["precision=fp64", "choose one of"]),
    # ---------------------------------------------------------------- sizes
    C("zero_global_batch", ["train.global_batch_size=0"], ["train.global_batch_size=0", "above 0"]),
    C("negative_micro_batch", ["train.micro_batch_size=-1"], ["train.micro_batch_size=-1", "above 0"]),
    C("zero_workers", ["cluster.num_workers=0"], ["cluster.num_workers=0", "above 0"]),
    # ---------------------------------------------------------------- layouts
    C("tp_not_dividing_heads", ["parallel=tp", "model.dim=96", "model.n_heads=3", "model.n_kv_heads=0"],
      ["model.n_heads=3", "parallel.tp=2", "divisor"]),
    C("batch_not_divisible", ["train.global_batch_size=6", "train.micro_batch_size=2"],
      ["train.global_batch_size=6", "multiple of 4"]),
    C("pp_above_layers", ["parallel=pp", "parallel.pp=4", "cluster.num_workers=4", "model.n_layers=2"],
      ["model.n_layers=2", "parallel.pp=4"]),
    C("dp_tp_pp_not_world", ["parallel.dp=3"], ["parallel.dp", "cluster.num_workers=2", "parallel.dp=0"]),
    # ---------------------------------------------------------------- elastic data parallel
    C("elastic_min_above_num", ["cluster.min_workers=3"], ["cluster.min_workers=3", "cluster.num_workers=2"]),
    C("elastic_sharded", ["cluster.min_workers=1", "cluster.max_failures=1", "parallel=fsdp"],
      ["cluster.min_workers=1", "parallel.data_parallel=fsdp", "parallel=ddp"]),
    C("elastic_tensor_parallel", ["cluster.min_workers=1", "cluster.max_failures=1", "parallel=tp"],
      ["cluster.min_workers=1", "parallel.tp=2", "parallel=ddp"]),
    C("elastic_dp_fixed", ["cluster.min_workers=1", "cluster.max_failures=1", "parallel.dp=2"],
      ["parallel.dp=2", "parallel.dp=0"]),
    C("elastic_batch_not_divisible", ["cluster.num_workers=3", "cluster.min_workers=1", "cluster.max_failures=1",
                                      "train.global_batch_size=8"],
      ["train.global_batch_size=8", "3 workers (2 x 3 = 6)", "train.global_batch_size=12"]),
    C("elastic_without_failures", ["cluster.min_workers=1"],
      ["cluster.min_workers=1", "cluster.max_failures=0", "cluster.max_failures=1"]),
    C("elastic_uneven_shares", ["cluster.min_workers=1", "cluster.max_failures=1", "parallel.dp_balance=weighted"],
      ["parallel.dp_balance=weighted", "parallel.dp_balance=equal"]),
    # ---------------------------------------------------------------- device
    C("cuda_without_gpu", ["cluster.device=cuda"], ["cluster.device=cuda", "cluster.device=cpu"],
      skip="this machine has CUDA" if torch.cuda.is_available() else ""),
    # ---------------------------------------------------------------- paths
    C("data_path_missing", ["data=tokens", "data.path={work}/absent.bin", f"data.vocab_size={VOCAB}"],
      ["data.path=", "absent.bin", "does not exist"]),
    C("data_path_escapes", ["data=tokens", "data.path=../tokens.bin", f"data.vocab_size={VOCAB}"],
      ["data.path='../tokens.bin'", "working directory", "absolute path"]),
    C("output_dir_escapes", ["output_dir=runs/../../elsewhere"], ["output_dir='runs/../../elsewhere'", "absolute"]),
    C("tracking_store_escapes", ["tracking.uri=sqlite:///../mlflow.db"],
      ["tracking.uri='sqlite:///../mlflow.db'", "absolute path: tracking.uri=sqlite:////"]),
    # ---------------------------------------------------------------- token files
    C("tokens_wrong_dtype", ["data=tokens", "data.path={odd_size}", f"data.vocab_size={VOCAB}"],
      ["data.path=", "not a multiple of 2", "data.token_dtype=uint16"]),
    C("tokens_above_vocab", ["data=tokens", "data.path={big_ids}", f"data.vocab_size={VOCAB}"],
      ["holds token id", f"data.vocab_size={VOCAB}", "set data.vocab_size="]),
    C("tokens_too_short", ["data=tokens", "data.path={short}", f"data.vocab_size={VOCAB}"],
      ["data.path=", "train.global_batch_size=4", "longer corpus"]),
    # ---------------------------------------------------------------- services
    C("ray_unreachable", ["cluster=ray", "cluster.address=127.0.0.1:{closed_port}", "cluster.start_timeout_s=2"],
      ["cluster.address='127.0.0.1:", "nothing answers", "ray start --head"]),
    C("mlflow_sqlite_unwritable", ["tracking.uri=sqlite:////proc/self/mlflow.db"],
      ["tracking.uri='sqlite:////proc/self/mlflow.db'", "cannot be written", "tracking=none"]),
    C("mlflow_read_only_dir", ["tracking.uri=sqlite:///{read_only}/mlflow.db"], ["tracking.uri=", "cannot be written"],
      skip="root writes through directory permissions" if os.geteuid() == 0 else ""),
    # ---------------------------------------------------------------- checkpoints
    C("checkpoint_truncated", ["train.resume=checkpoints/step_00000010"],
      ["step_00000010", "__0_0.distcp should have 8192 bytes, has 4096", "train.resume="]),
    C("checkpoint_corrupt_metadata", ["train.resume=checkpoints/step_00000020"],
      ["step_00000020", "trainlab.json is corrupt", "earlier checkpoint"]),
    C("checkpoint_missing", ["train.resume=checkpoints/step_00000030"],
      ["step_00000030", "does not exist", "train.resume=never"]),
    C("checkpoint_folder_without_any", ["train.resume=."], ["train.resume='/", "no complete checkpoint"]),
    C("checkpoint_keep_zero", ["train.checkpoint_keep=0"], ["train.checkpoint_keep=0", "above 0"]),
    C("fault_injection_malformed", ["train.inject_fault=kill"], ["train.inject_fault='kill'", "sigkill@5:1"]),
    # ---------------------------------------------------------------- divergence policy
    C("rollback_to_a_lower_precision", ["precision=bf16", "train.on_divergence=rollback",
                                        "train.rollback_precision=fp16"],
      ["train.rollback_precision=fp16", "not higher than precision=bf16", "use fp32"]),
    C("rollback_that_changes_nothing", ["train.on_divergence=rollback", "train.rollback_lr_factor=1"],
      ["train.on_divergence=rollback", "train.rollback_lr_factor=1", "retry the same computation"]),
]


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    ray_session: list[str]


def _digest(*roots: Path) -> str:
    """sha256 over the relative path and bytes of every file under roots (and their modes)."""
    h = hashlib.sha256()
    for root in roots:
        files = sorted(p for p in root.rglob("*")) if root.is_dir() else [root]
        for p in files:
            h.update(str(p.relative_to(root.parent)).encode())
            h.update(oct(p.stat().st_mode).encode())
            if p.is_file():
                h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A working directory holding what a user's would: an MLflow store with a finished run,
    a checkpoint directory, and token files good and bad."""
    from mlflow.tracking import MlflowClient

    work = tmp_path_factory.mktemp("work")
    store = work / "mlflow.db"
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    run = client.create_run(client.create_experiment("bad_input"), run_name="earlier")
    client.log_metric(run.info.run_id, "train/loss", 1.5, step=1)
    client.set_terminated(run.info.run_id, status="FINISHED")
    # a checkpoint whose shard was cut to half the size its metadata records, and one whose
    # metadata is not JSON (engine.checkpoint's layout)
    ckpt = work / "checkpoints" / "step_00000010"
    ckpt.mkdir(parents=True)
    (ckpt / "__0_0.distcp").write_bytes(np.random.default_rng(0).bytes(4096))
    (ckpt / "trainlab.json").write_text('{"version": 1, "step": 10, "files": {"__0_0.distcp": 8192}}')
    (work / "checkpoints" / "step_00000020").mkdir()
    (work / "checkpoints" / "step_00000020" / "trainlab.json").write_text("{not json")
    odd = work / "odd_size.bin"
    odd.write_bytes(np.arange(20_001, dtype=np.uint8).tobytes())  # not whole uint16s
    big = write_token_file(work / "big_ids.bin", np.arange(20_000) % (VOCAB + 5), "uint16")
    short = write_token_file(work / "short.bin", np.arange(100) % VOCAB, "uint16")  # 2 train windows
    read_only = work / "read_only"
    read_only.mkdir(mode=0o500)
    files = {"work": work, "odd_size": odd, "big_ids": big, "short": short, "read_only": read_only,
             "closed_port": _closed_port()}
    return work, [store, work / "checkpoints"], files


def _run(case: Case, work: Path, files: dict, env: dict) -> Outcome:
    args = [a.format(**files) for a in case.args]
    flags = [a for a in args if a.startswith("-")]
    cmd = [sys.executable, "-m", "trainlab.cli", "train", *flags, *TINY,
           *[a for a in args if not a.startswith("-")]]
    with tempfile.TemporaryDirectory(prefix="tlbad-") as ray_tmp:  # Ray would start its session here
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=120,
                              env={**env, "RAY_TMPDIR": ray_tmp, "TMPDIR": ray_tmp})
        seconds = time.perf_counter() - start
        session = [str(p) for p in Path(ray_tmp).rglob("session_*")]
    return Outcome(proc.returncode, proc.stdout, proc.stderr, seconds, session)


@pytest.fixture(scope="module")
def outcomes(world, tmp_path_factory):
    """Every case run once, three at a time (each is a Python start-up plus a check), with the
    store and the checkpoint hashed before and after each."""
    work, kept, files = world
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_", "HYDRA_"))}
    env |= {"PYTHONUNBUFFERED": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{kept[0]}"}  # the store at risk
    before = _digest(*kept)
    runnable = [c for c in CASES if not c.skip]
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = dict(zip([c.id for c in runnable], pool.map(lambda c: _run(c, work, files, env), runnable)))
    return results, before, _digest(*kept)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_cleanly(case, outcomes):
    if case.skip:
        pytest.skip(case.skip)
    results, _, _ = outcomes
    out = results[case.id]
    shown = f"\n--- stdout\n{out.stdout[-2000:]}\n--- stderr\n{out.stderr[-3000:]}"
    assert out.returncode == 2, shown
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, shown
    for part in case.says:
        assert part in out.stderr, f"{part!r} not in the message{shown}"
    assert "Traceback" not in out.stdout + out.stderr, shown
    assert "HYDRA_FULL_ERROR" not in out.stderr, shown  # Hydra's own report was not printed
    assert not out.ray_session, f"a Ray session was started: {out.ray_session}"
    assert out.seconds < 60, f"took {out.seconds:.0f} s to refuse"


def test_existing_runs_and_checkpoints_are_untouched(outcomes, world):
    _, before, after = outcomes
    assert before == after, "the MLflow store or the checkpoint directory changed"
    _, kept, _ = world
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{kept[0]}")
    runs = client.search_runs([client.get_experiment_by_name("bad_input").experiment_id])
    assert [r.info.status for r in runs] == ["FINISHED"]  # still just the one earlier run
