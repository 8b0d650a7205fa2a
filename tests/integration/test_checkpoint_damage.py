"""Damaged checkpoints and failed saves, as a user meets them, from a real trial's checkpoints.

One short trial under torchrun (2 gloo ranks, no Ray, tracking=none) saves at steps 2 and 4;
copies of its checkpoints are then damaged the ways the issue found reaching the workers (a
byte flipped in a DCP shard or in DCP's .metadata, garbage in a rank file, a changed manifest)
or resumed by another config. Through the real CLI (`python -m trainlab.cli train ...`) each is
refused before Ray starts: exit 2, one `error:` line naming the file (or the fields) and the
fix, no traceback, no Ray session, the checkpoint's bytes unchanged. Under torchrun,
train.resume=auto goes back from a damaged latest checkpoint to the one before, saying so, and
ends where the undamaged trial ended. A save that cannot be written (a file-size limit, the way
a full disk fails torch's writer) fails the trial with the reason and leaves no step_*.tmp.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import assert_refused, free_port
from trainlab import names
from trainlab.config.checkpoints import complete_checkpoints, step_dir

pytestmark = pytest.mark.distributed

TRIAL = ["model=tiny", "data=markov", "train.max_steps=5", "train.global_batch_size=4",
         "train.micro_batch_size=2", "train.seq_len=32", "train.checkpoint_every=2", "train.eval_every=0",
         "tracking=none", "cluster.num_workers=2"]


def torchrun(args: list[str], *, cwd: Path, max_file_bytes: int = 0) -> subprocess.CompletedProcess:
    """The trial on 2 gloo ranks under torchrun; `max_file_bytes` caps every file its processes
    write (RLIMIT_FSIZE: a write past it fails as on a full disk; Python ignores SIGXFSZ)."""
    limit = (lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))) \
        if max_file_bytes else None
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "trainlab.train", *TRIAL, *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, preexec_fn=limit)


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[names.LOSS] for r in rows if names.LOSS in r}


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def garbage(path: Path) -> None:
    path.write_bytes(os.urandom(path.stat().st_size))


def manifest_step_changed(path: Path) -> None:
    """Valid JSON of the same size, one value changed (as a flipped digit would)."""
    text = path.read_text()
    assert '"step": 4,' in text
    path.write_text(text.replace('"step": 4,', '"step": 6,'))


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(work dir, checkpoint folder, losses) of a finished trial with checkpoints at steps 2 and
    4. A stale step_*.tmp (a save that crashed earlier) lay in its folder when it started."""
    work = tmp_path_factory.mktemp("saved")
    root = work / "checkpoints"
    stale = root / "step_00000009.tmp"
    stale.mkdir(parents=True)
    (stale / "__0_0.distcp").write_bytes(b"half a shard")
    proc = torchrun([f"hydra.run.dir={work / 'run'}", f"train.checkpoint_dir={root}"], cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [c.step for c in complete_checkpoints(root)] == [2, 4]
    assert not stale.exists(), "the crashed save's folder outlived the next start"
    return work, root, losses(work / "run")


def copy_of(saved, name: str) -> Path:
    work, root, _ = saved
    dst = work / "copies" / name
    shutil.copytree(root, dst)
    return dst


# (id, damage to a copy of the checkpoints, train.resume (a step folder, or auto with the copy
# as train.checkpoint_dir), extra overrides, what the error line must say)
CASES = [
    ("shard_flipped", lambda c: flip(step_dir(c, 4) / "__0_0.distcp"), "step4", [],
     ["step_00000004 is damaged", "__0_0.distcp does not match the sha256", "train.resume=", "step_00000002",
      "train.resume=never"]),
    ("shard_missing", lambda c: (step_dir(c, 4) / "__1_0.distcp").unlink(), "step4", [],
     ["step_00000004 is damaged", "__1_0.distcp is missing", "train.resume=", "step_00000002",
      "train.resume=never"]),
    ("dcp_metadata_flipped", lambda c: flip(step_dir(c, 4) / ".metadata"), "step4", [],
     ["step_00000004 is damaged", ".metadata does not match the sha256", "step_00000002"]),
    ("rank_file_garbage", lambda c: garbage(step_dir(c, 4) / "rank_1.pt"), "step4", [],
     ["step_00000004 is damaged", "rank_1.pt does not match the sha256", "step_00000002"]),
    ("manifest_changed", lambda c: manifest_step_changed(step_dir(c, 4) / "trainlab.json"), "step4", [],
     ["step_00000004 is damaged", "trainlab.json is corrupt", "own checksum", "step_00000002"]),
    ("another_model", lambda c: None, "step4", ["model.dim=128"],
     ["step_00000004 was written by another config", "model.dim 64 vs 128", "run with model.dim=64",
      "train.resume=never"]),
    ("another_config_auto", lambda c: None, "auto", ["optim.lr=0.01"],
     ["train.resume=auto found", "step_00000004", "optim.lr 0.001 vs 0.01", "train.checkpoint_dir",
      "train.resume=never"]),
    ("auto_none_intact", lambda c: [flip(step_dir(c, s) / "__1_0.distcp") for s in (2, 4)], "auto", [],
     ["step_00000004 is damaged", "__1_0.distcp does not match", "no earlier checkpoint beside it is intact",
      "train.resume=never"]),
]


GATE = ("shard_flipped", "manifest_changed", "another_model")
"""One refusal of each kind in the gate tier (a damaged shard, a damaged manifest, another config);
the other forms of the same checks run in the slow tier: each is a CLI start-up of ~6 s."""


@pytest.mark.parametrize("case", [c if c[0] in GATE else pytest.param(c, marks=pytest.mark.slow) for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_damaged_or_foreign_checkpoint_is_refused_before_ray_starts(case, saved):
    name, damage, resume, extra, says = case
    work = saved[0]
    ckpts = copy_of(saved, name)
    damage(ckpts)
    before = digest(ckpts)
    where = [f"train.resume={step_dir(ckpts, 4)}"] if resume == "step4" else \
        [f"train.checkpoint_dir={ckpts}", "train.resume=auto"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_", "HYDRA_"))}
    with tempfile.TemporaryDirectory(prefix="tlckpt-") as ray_tmp:  # Ray would start its session here
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "trainlab.cli", "train", *TRIAL, *extra, *where],
                              cwd=work, capture_output=True, text=True, timeout=120,
                              env={**env, "RAY_TMPDIR": ray_tmp, "TMPDIR": ray_tmp, "PYTHONUNBUFFERED": "1"})
        seconds = time.perf_counter() - t0
        session = list(Path(ray_tmp).rglob("session_*"))
    assert_refused(proc, says, sessions=session)
    assert seconds < 60, f"took {seconds:.0f} s to refuse"
    assert digest(ckpts) == before, "the refused checkpoint was changed"


@pytest.mark.slow  # a trial that trains: the gate refuses, this recovers
def test_auto_resumes_from_the_checkpoint_before_a_damaged_latest_one_and_says_so(saved, tmp_path):
    _, _, uninterrupted = saved
    ckpts = copy_of(saved, "fallback")
    flip(step_dir(ckpts, 4) / "__1_0.distcp")
    proc = torchrun([f"hydra.run.dir={tmp_path / 'run'}", f"train.checkpoint_dir={ckpts}"], cwd=tmp_path)
    out = " ".join((proc.stdout + proc.stderr).split())  # rich wraps long lines
    assert proc.returncode == 0, out[-3000:]
    damaged = f"warning: checkpoint {step_dir(ckpts, 4)} is damaged: __1_0.distcp does not match"
    assert damaged in out, out[-3000:]
    assert f"resuming from {step_dir(ckpts, 2)} (step 2), the newest intact one" in out
    assert f"resumed from {step_dir(ckpts, 2)} at step 2" in out
    resumed = losses(tmp_path / "run")
    assert sorted(resumed) == [3, 4, 5]
    assert resumed == {s: uninterrupted[s] for s in (3, 4, 5)}  # bit for bit, as if nothing had happened
    # the damaged step 4 was replaced by the resumed trial's own save of step 4
    assert [c.step for c in complete_checkpoints(ckpts)] == [2, 4]


@pytest.mark.slow  # a trial that trains until its save fails
def test_a_save_that_cannot_be_written_fails_cleanly_and_leaves_no_partial_folder(saved, tmp_path):
    work, root, _ = saved
    sizes = {p.name: p.stat().st_size for p in step_dir(root, 2).iterdir()}
    shard = min(v for k, v in sizes.items() if k.endswith(".distcp"))
    cap = shard // 2  # the shards cannot be written; every other file of the trial can
    assert max(v for k, v in sizes.items() if not k.endswith(".distcp")) < cap
    ckpts = tmp_path / "checkpoints"
    proc = torchrun([f"hydra.run.dir={tmp_path / 'run'}", f"train.checkpoint_dir={ckpts}"], cwd=tmp_path,
                    max_file_bytes=cap)
    err = " ".join(proc.stderr.split())
    assert proc.returncode != 0
    said = f"the checkpoint of step 2 could not be written to {ckpts / 'step_00000002.tmp'}"
    assert said in err, err[-3000:]
    assert "its partial files were removed" in err and "train.checkpoint_dir" in err
    assert sorted(p.name for p in ckpts.iterdir() if p.name.startswith("step_")) == []
    assert sorted(losses(tmp_path / "run")) == [1, 2]  # the steps recorded before the save
