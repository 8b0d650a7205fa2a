"""Checkpoint manifests: a SHA-256 per file recorded at save and checked before a resume, the
trial's config fields beside it, and which checkpoint train.resume lands on when one is damaged.

The folders here are laid out as engine/checkpoint.py writes them (files + a sealed manifest),
with random bytes for the shards; the real save and the CLI are in
tests/integration/test_checkpoint_damage.py."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
import re
import shlex
from pathlib import Path

import pytest

from trainlab.config import compose_run_config, config_hash
from trainlab.config.checkpoints import META_FILE, CheckpointError, step_dir
from trainlab.config.convert import hashed_config
from trainlab.engine import integrity
from trainlab.engine.resume import check_checkpoint, resolve_resume, verify_here

FILES = {"__0_0.distcp": 4096, "__1_0.distcp": 4000, ".metadata": 700, "rank_0.pt": 300, "rank_1.pt": 300}


def fields(*overrides: str) -> dict:
    return dict(_fields(overrides))  # a copy: composing is the slow part


@functools.lru_cache(maxsize=None)
def _fields(overrides: tuple[str, ...]) -> dict:
    return hashed_config(compose_run_config(["model=tiny", *overrides]))


def make_checkpoint(root: Path, step: int, *, config: dict | None = None, config_hash: str = "x") -> Path:
    """A checkpoint folder as a save leaves it: its files, then the sealed manifest."""
    path = step_dir(root, step)
    path.mkdir(parents=True)
    for name, size in FILES.items():
        (path / name).write_bytes(os.urandom(size))
    meta = {"version": 2, "step": step, "config_hash": config_hash, "config": integrity.as_json(config or fields()),
            "files": integrity.describe_files(path, sorted(FILES))}
    (path / META_FILE).write_text(json.dumps(integrity.seal(meta), indent=1))
    return path


def flip(path: Path, offset: int | None = None) -> None:
    """Invert one byte in place: the size stays, the content does not."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if offset is None else offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_every_file_gets_its_size_and_sha256_and_a_flipped_byte_is_named(tmp_path):
    path = make_checkpoint(tmp_path, 4)
    files = json.loads((path / META_FILE).read_text())["files"]
    assert set(files) == set(FILES)
    assert files["__0_0.distcp"]["bytes"] == 4096 and len(files["__0_0.distcp"]["sha256"]) == 64
    assert check_checkpoint(path, verify=verify_here)["step"] == 4
    assert verify_here(path, files) == []

    flip(path / "__1_0.distcp")
    assert verify_here(path, files) == ["__1_0.distcp does not match the sha256 recorded at save"]
    with pytest.raises(CheckpointError, match=r"__1_0\.distcp does not match the sha256") as e:
        check_checkpoint(path, verify=verify_here)
    assert "train.resume=never" in str(e.value)
    check_checkpoint(path)  # sizes alone cannot tell (the check the workers did before)


def test_each_rank_checks_a_share_and_the_shares_cover_every_file(tmp_path):
    path = make_checkpoint(tmp_path, 4)
    files = json.loads((path / META_FILE).read_text())["files"]
    shares = [integrity.share(list(files), rank=r, world=3) for r in range(3)]
    assert sorted(n for s in shares for n in s) == sorted(files) and all(shares)
    flip(path / "rank_1.pt")
    found = [p for r in range(3) for p in integrity.digest_problems(path, files, rank=r, world=3)]
    assert found == ["rank_1.pt does not match the sha256 recorded at save"]


def test_a_changed_manifest_is_refused_by_its_own_checksum(tmp_path):
    path = make_checkpoint(tmp_path, 4)
    text = (path / META_FILE).read_text()
    (path / META_FILE).write_text(text.replace('"step": 4', '"step": 5'))  # still valid JSON, same size
    with pytest.raises(CheckpointError, match="trainlab.json is corrupt .its own checksum does not match"):
        check_checkpoint(path)


def test_a_manifest_of_format_1_sizes_only_still_loads(tmp_path):
    path = tmp_path / "step_00000003"
    path.mkdir()
    (path / "__0_0.distcp").write_bytes(b"x" * 10)
    (path / META_FILE).write_text(json.dumps({"version": 1, "step": 3, "files": {"__0_0.distcp": 10}}))
    assert check_checkpoint(path, verify=verify_here)["step"] == 3
    (path / "__0_0.distcp").write_bytes(b"x" * 9)
    with pytest.raises(CheckpointError, match="__0_0.distcp should have 10 bytes, has 9"):
        check_checkpoint(path)


def test_auto_goes_back_to_the_newest_intact_checkpoint_saying_which_was_damaged(tmp_path):
    for step in (2, 4, 6):
        make_checkpoint(tmp_path, step)
    flip(step_dir(tmp_path, 6) / ".metadata")
    (step_dir(tmp_path, 4) / "rank_0.pt").write_bytes(b"short")
    said: list[str] = []
    found = resolve_resume("auto", tmp_path, expect_config=fields(), verify=verify_here, warn=said.append)
    assert found is not None and found.step == 2
    (warning,) = said
    assert str(step_dir(tmp_path, 6)) in warning and ".metadata does not match the sha256" in warning
    assert "and 1 more damaged" in warning and f"resuming from {step_dir(tmp_path, 2)} (step 2)" in warning
    # the same folder given as train.resume=PATH is read the same way
    again = resolve_resume(str(tmp_path), tmp_path / "elsewhere", verify=verify_here, warn=said.append)
    assert again.step == 2


def test_auto_with_no_intact_checkpoint_is_refused_naming_the_newest_and_the_fix(tmp_path):
    for step in (2, 4):
        make_checkpoint(tmp_path, step)
        flip(step_dir(tmp_path, step) / "__0_0.distcp")
    with pytest.raises(CheckpointError) as e:
        resolve_resume("auto", tmp_path, verify=verify_here, warn=lambda m: None)
    msg = str(e.value)
    assert str(step_dir(tmp_path, 4)) in msg and "__0_0.distcp does not match" in msg
    assert "no earlier checkpoint beside it is intact (2 checked)" in msg and "train.resume=never" in msg


def test_a_damaged_checkpoint_named_is_refused_suggesting_the_earlier_intact_one(tmp_path):
    make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 4)
    path = make_checkpoint(tmp_path, 6)
    (step_dir(tmp_path, 4) / "rank_1.pt").unlink()  # damaged too: not the one to suggest
    flip(path / "rank_0.pt", offset=0)
    said: list[str] = []
    with pytest.raises(CheckpointError) as e:
        resolve_resume(str(path), tmp_path, verify=verify_here, warn=said.append)
    assert str(e.value) == (f"checkpoint {path} is damaged: rank_0.pt does not match the sha256 recorded at "
                            f"save; resume from an earlier checkpoint (train.resume={step_dir(tmp_path, 2)}) "
                            f"or start over (train.resume=never train.checkpoint_dir={tmp_path}-new2)")
    assert said == []  # a checkpoint named is never swapped for another
    again = pickle.loads(pickle.dumps(e.value))  # as a Ray worker's error reaches the driver
    assert str(again) == str(e.value) and again.path == path


def test_another_configs_checkpoint_is_refused_naming_the_fields_and_the_overrides(tmp_path):
    path = make_checkpoint(tmp_path, 4, config=fields("model.dim=128", "optim.lr=0.01"))
    with pytest.raises(CheckpointError) as e:
        resolve_resume(str(path), tmp_path, expect_config=fields(), verify=verify_here)
    msg = str(e.value)
    assert "model.dim 128 vs 64" in msg and "optim.lr 0.01 vs 0.001" in msg
    assert "checkpoint vs this trial" in msg
    assert "run with model.dim=128 optim.lr=0.01" in msg and "train.resume=never" in msg
    with pytest.raises(CheckpointError, match=r"resume=auto found .*written by another config .model.dim"):
        resolve_resume("auto", tmp_path, expect_config=fields())
    # the same config is accepted, and where it reports or keeps checkpoints is not part of it
    same_trial = fields("model.dim=128", "optim.lr=0.01", "train.checkpoint_every=7", "tracking=none")
    same = resolve_resume(str(path), tmp_path, expect_config=same_trial)
    assert same.step == 4


def test_cluster_device_auto_matches_the_device_it_resolved_to():
    """torchrun saves cluster.device=auto; the Ray driver and its workers compare 'cpu'."""
    saved = integrity.as_json(fields("cluster.device=auto"))
    assert integrity.config_differences(saved, fields("cluster.device=cpu")) == []
    assert integrity.config_differences(integrity.as_json(fields("cluster.device=cuda")),
                                        fields("cluster.device=cpu")) == [("cluster.device", "cuda", "cpu")]


def test_the_overrides_named_as_the_fix_compose_the_checkpoints_config():
    saved = integrity.as_json(fields("model.dim=128", "precision.keep_hp=[output]", "data=tokens",
                                     "data.path=/data/my corpus.bin", "data.vocab_size=300",
                                     "precision.tf32=true"))
    diffs = integrity.config_differences(saved, fields())
    said, fix = integrity.describe_differences(diffs, limit=len(diffs))
    assert "model.dim 128 vs 64" in said and 'precision.keep_hp ["output"] vs ["output", "unaligned"]' in said
    assert "data.path='/data/my corpus.bin'" in fix and "precision.keep_hp=[output]" in fix
    assert "precision.tf32=true" in fix
    assert integrity.config_differences(saved, fields(*shlex.split(fix))) == []  # pasted into a shell


def test_the_config_hash_covers_exactly_the_recorded_fields():
    """Sweeps find finished trials by config hash in MLflow: the manifest's fields are its input."""
    run = compose_run_config(["model=tiny"])
    recorded = json.dumps(hashed_config(run), sort_keys=True).encode()
    assert config_hash(run) == hashlib.sha256(recorded).hexdigest()[:16]
    assert "model.dim" in hashed_config(run) and "tracking.uri" not in hashed_config(run)
    assert "train.checkpoint_dir" not in hashed_config(run)


# issue 28: lease (no advice that destroys data; explicit resume may extend a run)
def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_resume_never_beside_another_configs_checkpoint_is_refused_and_leaves_it_intact(tmp_path):
    make_checkpoint(tmp_path, 4, config=fields("model.dim=128"))
    (tmp_path / "trial.json").write_text('{"run_id": "theirs"}')
    before = _tree(tmp_path)
    with pytest.raises(CheckpointError) as e:
        resolve_resume("never", tmp_path, expect_config=fields(), verify=verify_here)
    msg = str(e.value)
    assert "train.resume=never" in msg and "model.dim 128 vs 64" in msg and str(tmp_path) in msg
    fix = re.search(r"train\.checkpoint_dir=(\S+)", msg).group(1)
    assert not Path(fix).exists() and Path(fix).parent == tmp_path.parent  # a fresh folder, safe to follow
    assert _tree(tmp_path) == before
    assert resolve_resume("never", Path(fix), expect_config=fields()) is None  # following the fix starts
    assert resolve_resume("never", tmp_path, expect_config=fields("model.dim=128")) is None  # its own: may


def test_no_refusal_suggests_starting_over_where_checkpoints_are(tmp_path):
    """Every start-over a refusal suggests names a fresh train.checkpoint_dir beside the folder."""
    path = make_checkpoint(tmp_path, 4, config=fields("model.dim=128"))
    said = []
    for call in (lambda: resolve_resume("auto", tmp_path, expect_config=fields()),
                 lambda: resolve_resume(str(path), tmp_path, expect_config=fields())):
        with pytest.raises(CheckpointError) as e:
            call()
        said.append(str(e.value))
    flip(path / "rank_0.pt")
    for call in (lambda: resolve_resume(str(path), tmp_path, verify=verify_here),
                 lambda: resolve_resume("auto", tmp_path, verify=verify_here, warn=lambda m: None)):
        with pytest.raises(CheckpointError) as e:
            call()
        said.append(str(e.value))
    for msg in said:
        assert "train.resume=never" in msg, msg
        fix = re.search(r"train\.resume=never train\.checkpoint_dir=(\S+?)[;,)]?(?:\s|$)", msg)
        assert fix and not Path(fix.group(1)).exists(), msg


def test_explicit_resume_may_extend_max_steps_but_not_shrink_below_the_checkpoint(tmp_path):
    def trial(max_steps: int, **more) -> dict:  # the fields as composed, these set (composing is slow)
        return {**fields(), "train.max_steps": max_steps, **more}

    path = make_checkpoint(tmp_path, 4, config=trial(10))
    assert resolve_resume(str(path), tmp_path, expect_config=trial(30)).step == 4
    assert resolve_resume("auto", tmp_path, expect_config=trial(30)).step == 4
    with pytest.raises(CheckpointError, match=r"train.max_steps=3 .*step 4"):
        resolve_resume(str(path), tmp_path, expect_config=trial(3))
    with pytest.raises(CheckpointError, match="model.dim"):  # extending does not hide another change
        resolve_resume(str(path), tmp_path, expect_config=trial(30, **{"model.dim": 128}))


def test_retention_and_rollback_never_delete_another_configs_checkpoints(tmp_path):
    from trainlab.engine.checkpoint import discard_after, retire

    theirs = [make_checkpoint(tmp_path, s, config_hash="theirs") for s in (10, 20, 30)]
    before = {p: _tree(p) for p in theirs}
    mine = [make_checkpoint(tmp_path, s, config_hash="mine") for s in (1, 2, 3)]
    retire(tmp_path, keep=1, config_hash="mine")
    assert [p.exists() for p in mine] == [False, False, True]
    discard_after(tmp_path, 0, config_hash="mine")
    assert not mine[2].exists()
    assert {p: _tree(p) for p in theirs} == before  # byte for byte
