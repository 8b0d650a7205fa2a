"""train.export=hf never deletes what it did not write: the driver refuses a target that holds an
input of the trial, a user's file or another trial's export, and the export itself replaces only
its own trial's earlier, untouched export (written beside it, then renamed)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch

from trainlab.config import compose_run_config, config_hash
from trainlab.config.export_target import EXPORT_RECORD, check_export_target, export_folder, staging_folder
from trainlab.models import build_model
from trainlab.models.hf_demo import write_demo_model
from trainlab.models.hf_export import ExportRefused, export_hf
from trainlab.models.init import materialize


def _tree(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo_model(tmp_path_factory.mktemp("demo") / "model", family="llama", vocab_size=300, seed=0)


def _run(demo: Path, out: Path, *extra: str):
    return compose_run_config(["model=hf", f"model.pretrained={demo}", f"output_dir={out}", "train.export=hf",
                               *extra])


def _model(run, seed=1):
    with torch.device("meta"):
        model = build_model(run.model, vocab_size=300)
    materialize(model, device="cpu", seed=seed)
    return model


def test_fine_tuning_the_export_folder_itself_is_refused_naming_a_fresh_output_dir(demo, tmp_path):
    # the natural next step after downloading a winner: fine-tune w/hf_model again with output_dir=w
    w = tmp_path / "w"
    (w / "hf_model").mkdir(parents=True)
    for f in demo.iterdir():
        (w / "hf_model" / f.name).write_bytes(f.read_bytes())
    run = _run(w / "hf_model", w)
    with pytest.raises(ValueError) as e:
        check_export_target(run, trial_hash=config_hash(run))
    said = str(e.value)
    assert f"model.pretrained={w / 'hf_model'}" in said and "never replaces its inputs" in said
    assert f"output_dir={tmp_path / 'w-2'}" in said and not (tmp_path / "w-2").exists()
    # the advice is safe to follow: the same trial with output_dir=w-2 passes
    moved = _run(w / "hf_model", tmp_path / "w-2")
    check_export_target(moved, trial_hash=config_hash(moved))


def test_a_tokenizer_or_dataset_inside_the_target_is_refused(demo, tmp_path):
    inside = tmp_path / "out" / "hf_model" / "tok"
    inside.mkdir(parents=True)
    run = compose_run_config(["model=hf", f"model.pretrained={demo}", f"output_dir={tmp_path / 'out'}",
                              "train.export=hf", "data=hf", f"data.tokenizer={inside}", "data.path=x.jsonl"])
    with pytest.raises(ValueError, match=r"which holds data.tokenizer="):
        check_export_target(run, trial_hash=config_hash(run))


@pytest.mark.parametrize("what", ["user_file", "other_trial", "changed", "symlink", "file"])
def test_a_target_that_is_not_this_trials_own_untouched_export_is_refused(demo, tmp_path, what):
    out = tmp_path / "out"
    run = _run(demo, out)
    mine = config_hash(run)
    target = export_folder(run)
    elsewhere = tmp_path / "elsewhere"  # a folder of the user's the target links to
    elsewhere.mkdir()
    (elsewhere / "weights.bin").write_bytes(b"keep")
    if what == "symlink":
        out.mkdir()
        target.symlink_to(elsewhere)
    elif what == "file":
        out.mkdir()
        target.write_text("not a folder")
    else:
        export_hf(_model(run), cfg=run.model, out_dir=target, trial_hash="0123" if what == "other_trial" else mine)
        if what == "user_file":
            (target / "notes.txt").write_text("mine")
        elif what == "changed":
            with open(target / "config.json", "a") as f:
                f.write(" ")
    before = _tree(elsewhere)
    says = {"user_file": "holds files the export did not write (notes.txt)", "other_trial": "another trial",
            "changed": "was changed since it was exported (config.json)", "symlink": "is a symlink",
            "file": "is a file"}[what]
    with pytest.raises(ValueError, match=r"would replace .*" + says.replace("(", r"\(").replace(")", r"\)")):
        check_export_target(run, trial_hash=mine)
    # and the exporting rank refuses the same way, replacing nothing
    with pytest.raises(ExportRefused, match="nothing was replaced"):
        export_hf(_model(run, seed=2), cfg=run.model, out_dir=target, trial_hash=mine)
    if what == "user_file":
        assert (target / "notes.txt").read_text() == "mine"
    assert _tree(elsewhere) == before
    assert target.is_symlink() == (what == "symlink")


def test_a_rerun_replaces_its_own_export_and_a_cut_off_staging_folder(demo, tmp_path):
    run = _run(demo, tmp_path / "out")
    mine, target = config_hash(run), export_folder(run)
    first = export_hf(_model(run, seed=1), cfg=run.model, out_dir=target, trial_hash=mine)
    weights = _tree(first)["model-00001-of-00001.safetensors"]
    check_export_target(run, trial_hash=mine)  # its own untouched export: may be replaced
    # an export of the same trial cut off before its rename (a SIGKILL) left its staging folder
    staging = staging_folder(target)
    staging.mkdir()
    (staging / EXPORT_RECORD).write_text(f'{{"config_hash": "{mine}", "partial": true, "files": {{}}}}')
    (staging / "model-00001-of-00001.safetensors").write_bytes(b"half")
    check_export_target(run, trial_hash=mine)
    again = export_hf(_model(run, seed=2), cfg=run.model, out_dir=target, trial_hash=mine)
    assert again == target and not staging.exists() and not target.with_name("hf_model.old").exists()
    assert _tree(target)["model-00001-of-00001.safetensors"] != weights  # the new weights, whole
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(target)  # and transformers loads it


def test_a_staging_folder_of_someone_else_is_never_removed(demo, tmp_path):
    run = _run(demo, tmp_path / "out")
    staging = staging_folder(export_folder(run))
    staging.mkdir(parents=True)
    (staging / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"hf_model.partial, which holds files that no trainlab export wrote"):
        check_export_target(run, trial_hash=config_hash(run))
    assert (staging / "keep.txt").read_text() == "mine" and os.listdir(staging) == ["keep.txt"]
