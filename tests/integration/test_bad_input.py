"""Hostile input, refused the way a user meets it: every case must exit 2 with one `error:` line
that names the field and the bad value and says the fix, print no traceback, start no Ray
session, and leave an existing MLflow store (with a finished run in it) and a checkpoint
directory byte-for-byte as they were.

Where the config layer refuses a case (trainlab.config.overrides.check_overrides, the first
thing `trainlab train` runs, before Hydra's app: the command prints its ConfigError as the
`error:` line and exits 2) the case is checked in-process, through that same function in the
same working directory: a Python start-up per case cost more than the check. The real CLI
(`python -m trainlab.cli train ...` in a subprocess) runs every case the config layer lets
through (paths, token files, services, checkpoints: refused when the trial is planned) and
CLI_SAMPLE, one config-layer case of each kind, proving exit code, one line, no traceback, no
Ray session and the store untouched for that path too.

Config-layer details (which message for which field) are in tests/unit; this table checks that
each kind of bad input stops the command cleanly before anything starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import read_only_dir, torch_import_cpu_s
from trainlab.config import ConfigError
from trainlab.config.convert import CONF_DIR, SWEEPS_DIR
from trainlab.config.overrides import check_overrides
from trainlab.data import write_token_file
from trainlab.redact import redact

VOCAB = 100
REFUSAL_CPU_S = 6.0
"""CPU a refusal may take, in units of importing torch here (conftest.torch_import_cpu_s): 0.4 of
it where the config layer refuses, 2-4 where the trial's plan does (torch, MLflow, the parallel
layer and the memory estimate; a checkpoint refusal reads the checkpoint back too); see
test_refusal_time.py."""
HANG_S = 600
"""A command still running after this is killed and its case fails (a refusal that hangs)."""
TINY = ["model=tiny", "train.max_steps=2", "train.seq_len=32", "train.global_batch_size=4",
        "train.micro_batch_size=2", "cluster.num_workers=2", "tracking.experiment=bad_input"]


def _refusing_socket() -> socket.socket:
    """Bound to a loopback port and never listening: a connection there is refused, and no
    other process (a Ray another test left running) can take the port while it is held."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s


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
    C("mlflow_read_only_dir", ["tracking.uri=sqlite:///{locked}/mlflow.db"],
      ["tracking.uri=", "locked/mlflow.db", "cannot be written", "tracking=none"]),
    # no permissions needed: nobody, root included, can make a folder inside a regular file
    C("mlflow_store_under_a_file", ["tracking.uri=sqlite:///{odd_size}/mlflow.db"],
      ["tracking.uri=", "cannot be written (Not a directory: ", "odd_size.bin)", "tracking=none"]),
    # ---------------------------------------------------------------- checkpoints
    C("checkpoint_truncated", ["train.resume=checkpoints/step_00000010"],
      ["step_00000010", "__0_0.distcp should have 8192 bytes, has 4096", "train.resume="]),
    C("checkpoint_corrupt_metadata", ["train.resume=checkpoints/step_00000020"],
      ["step_00000020", "trainlab.json is corrupt", "earlier checkpoint"]),
    C("checkpoint_missing", ["train.resume=checkpoints/step_00000030"],
      ["step_00000030", "does not exist", "train.resume=never"]),
    C("checkpoint_folder_without_any", ["train.resume=."], ["train.resume='/", "no complete checkpoint"]),
    C("checkpoint_keep_zero", ["train.checkpoint_keep=0"], ["train.checkpoint_keep=0", "above 0"]),
    C("fault_injection_malformed", ["debug.inject_fault=kill"], ["debug.inject_fault='kill'", "sigkill@5:1"]),
    C("fault_injection_old_key", ["train.inject_fault=sigkill@5:1"],
      ["train.inject_fault=sigkill@5:1", "write debug.inject_fault=sigkill@5:1"]),
    C("fp8_impl_auto_gone", ["precision=fp8_tensorwise", "precision.fp8_impl=auto"],
      ["precision.fp8_impl=auto", "precision.fp8_impl=native"]),
    # ---------------------------------------------------------------- divergence policy
    C("rollback_to_a_lower_precision", ["precision=bf16", "train.on_divergence=rollback",
                                        "train.rollback_precision=fp16"],
      ["train.rollback_precision=fp16", "not higher than precision=bf16", "use fp32"]),
    C("rollback_that_changes_nothing", ["train.on_divergence=rollback", "train.rollback_lr_factor=1"],
      ["train.on_divergence=rollback", "train.rollback_lr_factor=1", "retry the same computation"]),
    # ---------------------------------------------------------------- values that reached the workers, or passed
    C("lr_nan", ["optim.lr=nan"], ["optim.lr=nan", "not a finite number", "set optim.lr to a positive"]),
    C("lr_inf", ["optim.lr=inf"], ["optim.lr=inf", "not a finite number", "optim.lr=0.001"]),
    C("seed_negative", ["seed=-1"], ["seed=-1", "set seed to an integer in [0, 4294967295]"]),
    C("seed_past_int64", ["seed=99999999999999999999"], ["seed=99999999999999999999", "64-bit", "[0, 4294967295]"]),
    C("run_name_too_long", ["tracking.run_name=" + "r" * 300], ["tracking.run_name='rrrr", "300 bytes", "shorten it"]),
    C("grad_clip_nan", ["optim.grad_clip=nan"], ["optim.grad_clip=nan", "set optim.grad_clip to", "0 = no clipping"]),
    C("norm_eps_negative", ["model.norm_eps=-1"], ["model.norm_eps=-1.0", "positive", "model.norm_eps=1e-05"]),
    C("rope_theta_zero", ["model.rope_theta=0"], ["model.rope_theta=0.0", "a number > 1", "model.rope_theta=10000"]),
    C("max_steps_past_int64", ["train.max_steps=9223372036854775808"],
      ["train.max_steps=9223372036854775808", "64-bit", "train.max_steps=200"]),
    C("start_timeout_inf", ["cluster.start_timeout_s=inf"], ["cluster.start_timeout_s=inf", "(0, 86400]"]),
    C("experiment_empty", ["tracking.experiment=''"], ["tracking.experiment=''", "empty", "tracking.experiment=trainlab"]),
    # ---------------------------------------------------------------- folders that cannot be written
    C("output_dir_unmakeable", ["output_dir=/proc/nope"],
      ["output_dir='/proc/nope'", "cannot be made or written", "leave output_dir empty"]),
    C("checkpoint_dir_unmakeable", ["train.checkpoint_dir=/proc/nope"],
      ["train.checkpoint_dir='/proc/nope'", "cannot be made or written", "leave train.checkpoint_dir empty"]),
    C("checkpoint_dir_read_only", ["train.checkpoint_dir={locked}"],
      ["train.checkpoint_dir=", "locked", "cannot be made or written"]),
    C("hydra_run_dir_unmakeable", ["hydra.run.dir=/proc/nope"],
      ["hydra.run.dir='/proc/nope'", "set hydra.run.dir to a folder you can write"]),
    # ---------------------------------------------------------------- what to write instead
    C("dashed_flag", ["--max_steps=5"], ["'--max_steps=5'", "write train.max_steps=5"]),
    C("yaml_form", ["model: small"], ["'model: small'", "write model=small"]),
    C("group_removed", ["~model"], ["model.name is not set", "`~model`", "model=OPTION", "tiny"]),
    C("path_cut_at_a_space", ["data=tokens", "data.path=my", "file.bin", f"data.vocab_size={VOCAB}"],
      ["'file.bin'", "'data.path=my file.bin'", "data.path=\"'my file.bin'\""]),
    # ---------------------------------------------------------------- group options outside the config tree
    C("option_climbs_out", ["model={evil_model}"], ["model=../", "not an option of model", "conf/model/", "tiny"]),
    C("sweep_option_climbs_out", ["-m", "+sweep={evil_sweep}"],
      ["sweep=../", "not an option of sweep", "sweeps/sweep/", "precision_shootout"]),
    # ---------------------------------------------------------------- 28 more hostile inputs (own invention)
    C("text_newline", ["tracking.run_name=a\nb"], ["tracking.run_name='a\\nb'", "control character", "remove it"]),
    C("text_undecodable_bytes", [os.fsdecode(b"tracking.run_name=\xff\xfe")],
      ["tracking.run_name='\\udcff\\udcfe'", "not valid UTF-8", "write it in UTF-8"]),
    C("text_bidi_override", ["tracking.experiment='\u202egpj.exe'"],
      ["tracking.experiment=", "bidirectional-override", "remove it"]),
    C("text_unquoted_unicode", ["tracking.run_name=ünï"], ["tracking.run_name='ünï'", "inside quotes",
                                                          "\"tracking.run_name='ünï'\""]),
    C("text_multibyte_too_long", ["tracking.run_name='" + "é" * 150 + "'"], ["tracking.run_name=", "300 bytes", "200"]),
    C("text_control_in_list", ["precision=fp8_tensorwise", "precision.keep_hp=['a\tb']"],
      ["precision.keep_hp=['a\\tb']", "control character"]),
    C("run_name_climbs_out", ["tracking.run_name=../../escape"],
      ["tracking.run_name='../../escape'", "'/'", "tracking.run_name=escape"]),
    C("value_with_equals", ["data.path=a=b"], ["data.path", "quote it", "\"data.path='a=b'\""]),
    C("eval_every_past_int64", ["train.eval_every=18446744073709551616"], ["train.eval_every=18446744073709551616", "64-bit"]),
    C("global_batch_past_int64", ["train.global_batch_size=99999999999999999999999"],
      ["train.global_batch_size=99999999999999999999999", "64-bit", "train.global_batch_size=16"]),
    C("max_failures_past_int64", ["cluster.max_failures=99999999999999999999"], ["cluster.max_failures=9999", "64-bit"]),
    C("negative_seq_len", ["train.seq_len=-128"], ["train.seq_len=-128", "positive", "train.seq_len=128"]),
    C("negative_corpus", ["data=markov", "data.num_tokens=-5", "data.vocab_size=16"], ["data.num_tokens=-5", "positive"]),
    C("zero_cpus_per_worker", ["cluster.cpus_per_worker=0"], ["cluster.cpus_per_worker=0", "positive"]),
    C("beta_of_one", ["optim.beta2=1"], ["optim.beta2=1.0", "[0, 1)", "optim.beta2=0.95"]),
    C("loss_scale_past_fp32", ["precision=fp16", "precision.init_scale=1e39"],
      ["precision.init_scale=1e+39", "2**127", "fp32"]),
    C("fp8_margin_huge", ["precision.fp8_margin=1000"], ["precision.fp8_margin=1000", "[0, 126]"]),
    C("timeout_past_os_timer", ["tracking.close_timeout_s=1e10"], ["tracking.close_timeout_s=10000000000.0", "86400"]),
    C("negative_rank_weight", ["parallel.dp_balance=weighted", "parallel.dp_weights=[1,-1]"],
      ["parallel.dp_weights=[1.0, -1.0]", "holds -1.0", "each element of parallel.dp_weights"]),
    C("slowdown_below_one", ["debug.slowdown=[0.5,1]"], ["debug.slowdown=[0.5, 1.0]", "holds 0.5", ">= 1"]),
    C("min_workers_negative", ["cluster.min_workers=-1"], ["cluster.min_workers=-1", "[0, cluster.num_workers=2]"]),
    C("duplicate_override_last_bad", ["train.max_steps=5", "train.max_steps=-5"], ["train.max_steps=-5", "positive"]),
    C("duplicate_group_first_climbs", ["model={evil_model}", "model=tiny"], ["not an option of model"]),
    C("option_backslash", ["precision=..\\x"], ["precision=..\\x", "not an option of precision", "bf16"]),
    C("output_dir_is_a_file", ["output_dir={odd_size}"], ["output_dir=", "odd_size.bin", "Not a directory"]),
    C("output_dir_name_too_long", ["output_dir=" + "o" * 300], ["output_dir='/", "/" + "o" * 300, "File name too long"]),
    C("hydra_run_dir_is_a_file", ["hydra.run.dir={odd_size}"], ["hydra.run.dir=", "Not a directory"]),
    C("sweep_dir_unmakeable", ["-m", "hydra.sweep.dir=/proc/nope", "seed=1,2"],
      ["hydra.sweep.dir='/proc/nope'", "set hydra.sweep.dir to a folder you can write"]),
    # issue 28: lease
    C("resume_never_over_another_trials_checkpoints", ["train.checkpoint_dir=checkpoints", "train.resume=never"],
      ["train.resume=never would start this trial over in", "step_000000", "are never replaced",
       "train.resume=never train.checkpoint_dir=", "checkpoints-new2"]),
    C("trial_held_by_another_driver", ["train.checkpoint_dir={held}"],
      ["train.checkpoint_dir=", "is in use", "host elsewhere.example, pid 4242, since", "its own train.checkpoint_dir"]),
    # issue 28: sweep
    C("sweep_empty_range", ["-m", "seed=range(5,5)"], ["seed=range(5,5)", "no value", "seed=range(5,9)"]),
    C("sweep_over_max_trials", ["-m", "seed=range(0,300)"],
      ["300 trials", "hydra.launcher.max_trials=256", "hydra.launcher.max_trials=300"]),
    C("keep_warm_on_a_local_cluster", ["-m", "seed=0,1", "hydra.launcher.keep_warm_s=60"],
      ["hydra.launcher.keep_warm_s=60", "cluster.address is empty", "ray start --head --node-ip-address=127.0.0.1"]),
    C("keep_warm_without_warm_gangs", ["-m", "seed=0,1", "cluster.address=127.0.0.1:6379",
                                       "hydra.launcher.keep_warm_s=60", "hydra.launcher.reuse_gangs=false"],
      ["hydra.launcher.keep_warm_s=60", "hydra.launcher.reuse_gangs=false"]),
    C("keep_warm_negative", ["-m", "seed=0,1", "hydra.launcher.keep_warm_s=-1"],
      ["hydra.launcher.keep_warm_s=-1", "negative", ">= 0"]),
    C("sweep_negative_concurrency", ["-m", "seed=0,1", "hydra.launcher.max_concurrent_trials=-1"],
      ["hydra.launcher.max_concurrent_trials=-1", ">= 0"]),
    C("sweep_file_missing", ["-m", "+sweep=nope"], ["sweep=nope", "precision_shootout", "sweeps/sweep/"]),
    C("workers_beyond_local_cpus", ["cluster.num_workers=1024", "train.global_batch_size=2048"],
      ["cluster.num_workers=1024", "needs 1024 CPUs", "local Ray cluster", "or fewer"]),
    C("sweep_with_a_trial_beyond_cpus", ["-m", "cluster.cpus_per_worker=1,4096"],
      ["cluster.cpus_per_worker=4096", "needs 8192 CPUs", "cluster.cpus_per_worker="]),
    # issue 28: refusals
    C("model_vocab_below_corpus", ["data=text", "model.vocab_size=100"],
      ["model.vocab_size=100", "corpus vocabulary (256, data=text)", "model.vocab_size=0"]),
    C("markov_one_state", ["data=markov", "data.vocab_size=1"], ["data.vocab_size=1", "data.vocab_size>=2"]),
    C("markov_corpus_past_memory", ["data=markov", "data.vocab_size=16", "data.num_tokens=1000000000000"],
      ["data.num_tokens=1000000000000", "GB", "lower it to data.num_tokens="]),
    C("model_past_memory", ["model.n_layers=10000", "model.dim=1000000"],
      ["model.n_layers=10000 model.dim=1000000", "GB together", "fix: a smaller model"]),
    C("sweep_with_a_trial_past_memory", ["-m", "model.n_layers=100", "model.dim=64,1000000"],
      ["the sweep has trials that cannot run; nothing was started", "model.dim=1000000", "a smaller model"]),
    C("experiment_deleted", ["tracking.experiment=deleted_exp"],
      ["tracking.experiment='deleted_exp' was deleted", "mlflow experiments restore --experiment-id",
       "tracking.experiment=deleted_exp_2"]),
    C("mlflow_folder_store", ["tracking.uri={work}/folder_store"],
      ["tracking.uri=", "folder_store", "MLflow 3 no longer writes", "folder_store.db", "MLFLOW_ALLOW_FILE_STORE=true"]),
    # issue 28: reads (a FIFO, /dev/zero, a directory, an oversized file for every file input: tests/unit/test_file_inputs.py)
    C("tokens_fifo", ["data=tokens", "data.path={fifo}", f"data.vocab_size={VOCAB}"],
      ["data.path=", "fifo.bin", "FIFO", "point data.path at a raw token file"]),
    C("tokens_int32_read_as_uint16", ["data=tokens", "data.path={wide_ids}", f"data.vocab_size={VOCAB}"],
      ["data.path=", "data.token_dtype=uint16", "every second id 0", "set data.token_dtype=int32"]),
    C("calibration_fifo", ["cluster.calibration={fifo}"],
      ["cluster.calibration=", "fifo.bin", "FIFO", "trainlab calibrate -o"]),
    C("nodes_absurd_count", ["cluster.nodes=[1000000000000xH100]"],
      ["cluster.nodes", "1000000000000xH100", "more than 1024", "cluster.nodes=[8xH100,8xH100]"]),
    C("nodes_count_missing", ["cluster.nodes=[xH100]"], ["cluster.nodes", "'xH100'", "no count", "8xH100"]),
]


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    ray_session: list[str]
    cpu_s: float = 0.0
    """CPU seconds the command used (user + system): what its refusal costs, whatever the load."""


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
    client.delete_experiment(client.create_experiment("deleted_exp"))  # issue 28: a soft-deleted experiment
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
    wide = write_token_file(work / "wide_ids.bin", np.arange(20_000) % VOCAB, "int32")  # read as uint16
    fifo = work / "fifo.bin"  # reading it would wait for a writer forever
    os.mkfifo(fifo)
    # a group option that leads out of conf/ (and sweeps/) to a YAML elsewhere
    (work / "elsewhere").mkdir()
    (work / "elsewhere" / "evil.yaml").write_text("defaults:\n  - /model_schema@_here_\n  - _self_\nname: evil\n")
    # issue 28: lease. A trial another driver trains now (its lease, renewed "now" for hours)
    (work / "held").mkdir()
    (work / "held" / "lease.json").write_text(json.dumps(
        {"holder": "other", "host": "elsewhere.example", "pid": 4242, "started": time.time(),
         "heartbeat": time.time() + 36_000}))
    refusing = _refusing_socket()
    files = {"work": work, "odd_size": odd, "big_ids": big, "short": short, "wide_ids": wide, "fifo": fifo,
             "closed_port": refusing.getsockname()[1], "locked": work / "locked", "held": work / "held",
             "evil_model": os.path.relpath(work / "elsewhere" / "evil", CONF_DIR / "model"),
             "evil_sweep": os.path.relpath(work / "elsewhere" / "evil", SWEEPS_DIR / "sweep")}
    with refusing, read_only_dir(work / "locked") as locked:  # even root cannot write it (chattr +i)
        files["locked_skip"] = "" if locked else "cannot make a folder read-only for root here"
        yield work, [store, work / "checkpoints"], files


def _run(case: Case, work: Path, files: dict, env: dict) -> Outcome:
    cmd = [sys.executable, "-m", "trainlab.cli", "train", *_argv(case, files)]
    with tempfile.TemporaryDirectory(prefix="tlbad-") as ray_tmp:  # Ray would start its session here
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**env, "RAY_TMPDIR": ray_tmp, "TMPDIR": ray_tmp})
        hung = threading.Timer(HANG_S, proc.kill)
        hung.start()
        with ThreadPoolExecutor(max_workers=2) as io:
            stdout, stderr = io.submit(proc.stdout.read), io.submit(proc.stderr.read)
            _, status, usage = os.wait4(proc.pid, 0)  # reaped here, for its own CPU time
        hung.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)  # Popen itself must not wait for it again
        seconds = time.perf_counter() - start
        session = [str(p) for p in Path(ray_tmp).rglob("session_*")]
    return Outcome(proc.returncode, stdout.result(), stderr.result(), seconds, session,
                   cpu_s=usage.ru_utime + usage.ru_stime)


CLI_SAMPLE = {
    "not_an_override",  # the override parser
    "unknown_key",  # Hydra's compose error, reworded
    "bad_value_in_a_sweep",  # a multirun's swept values
    "batch_not_divisible",  # the typed config's cross-field checks (the README's example)
    "option_climbs_out",  # a group option outside the config tree
    "group_removed",  # `~group`
    "hydra_run_dir_unmakeable",  # the folder Hydra would make
    "text_undecodable_bytes",  # bytes that are no UTF-8, through a real exec's argv
}
"""Config-layer cases that also run through the real CLI."""


def _argv(case: Case, files: dict) -> list[str]:
    """The arguments after `train`, as the CLI gets them: flags first, then TINY, then the case's."""
    args = [a.format(**files) for a in case.args]
    return [*[a for a in args if a.startswith("-")], *TINY, *[a for a in args if not a.startswith("-")]]


def _config_refusal(case: Case, work: Path, files: dict, env: dict) -> str | None:
    """The `error:` line `trainlab train` would print for the case if the config layer refuses it
    (check_overrides in the command's working directory and environment), else None."""
    with pytest.MonkeyPatch.context() as mp, contextlib.chdir(work):
        for key in [k for k in os.environ if k not in env]:
            mp.delenv(key)
        for key, value in env.items():
            mp.setenv(key, value)
        try:
            check_overrides(_argv(case, files))
        except ConfigError as e:
            return f"error: {redact(str(e))}"  # as trainlab.train.main prints it
    return None


@pytest.fixture(scope="module")
def outcomes(world, tmp_path_factory):
    """Every case run once, with the store and the checkpoint hashed before and after all: first
    in-process through the config layer; then, three at a time (each is a Python start-up plus
    a check), through the CLI those it let through and CLI_SAMPLE."""
    work, kept, files = world
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_", "HYDRA_"))}
    env |= {"PYTHONUNBUFFERED": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{kept[0]}"}  # the store at risk
    before = _digest(*kept)
    runnable = [c for c in CASES if not c.skip and not ("{locked}" in " ".join(c.args) and files["locked_skip"])]
    refused = {c.id: _config_refusal(c, work, files, env) for c in runnable}
    through_cli = [c for c in runnable if refused[c.id] is None or c.id in CLI_SAMPLE]
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = dict(zip([c.id for c in through_cli], pool.map(lambda c: _run(c, work, files, env), through_cli)))
    results |= {c.id: refused[c.id] for c in runnable if c.id not in results}
    results["_skipped"] = {c.id: files["locked_skip"] for c in CASES if c not in runnable}
    return results, before, _digest(*kept)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_cleanly(case, outcomes):
    if case.skip:
        pytest.skip(case.skip)
    results, _, _ = outcomes
    if case.id not in results:
        pytest.skip(results["_skipped"][case.id])
    out = results[case.id]
    if isinstance(out, str):  # refused in-process by the config layer: the line the CLI prints
        assert "\n" not in out, out
        for part in case.says:
            assert part in out, f"{part!r} not in the message\n{out}"
        return
    shown = f"\n--- stdout\n{out.stdout[-2000:]}\n--- stderr\n{out.stderr[-3000:]}"
    assert out.returncode == 2, shown
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, shown
    for part in case.says:
        assert part in out.stderr, f"{part!r} not in the message{shown}"
    assert "Traceback" not in out.stdout + out.stderr, shown
    assert "HYDRA_FULL_ERROR" not in out.stderr, shown  # Hydra's own report was not printed
    assert not out.ray_session, f"a Ray session was started: {out.ray_session}"
    # what a refusal costs, bounded in CPU time: three at a time on a loaded 2-core machine the
    # wall time of one that imports torch reached 70 s (120 s at a load average of 36)
    unit = torch_import_cpu_s()
    assert out.cpu_s < REFUSAL_CPU_S * unit, (f"took {out.cpu_s:.1f} s of CPU to refuse ({out.seconds:.0f} s wall; "
                                              f"import torch {unit:.1f} s)")


def test_existing_runs_and_checkpoints_are_untouched(outcomes, world):
    _, before, after = outcomes
    assert before == after, "the MLflow store or the checkpoint directory changed"
    _, kept, _ = world
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{kept[0]}")
    runs = client.search_runs([client.get_experiment_by_name("bad_input").experiment_id])
    assert [r.info.status for r in runs] == ["FINISHED"]  # still just the one earlier run
