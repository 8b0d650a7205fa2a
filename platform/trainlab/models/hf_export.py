"""train.export=hf: the trained model as transformers' save_pretrained folder, from any layout.

    export_hf(trainer.model, cfg=run.model, out_dir=".../hf_model", tokenizer="/tok",
              trial_hash=plan.config_hash)                                    # every rank

torch.distributed.checkpoint writes the parameters with HuggingFaceStorageWriter: every rank
its own shards (FSDP2, tensor parallel) or stages (pipeline), one copy of what is replicated,
consolidated into model.safetensors under the checkpoint's names (the model's checkpoint_key). Rank 0
adds config.json and the tokenizer, so ``AutoModelForCausalLM.from_pretrained(out_dir)`` loads
the trained model and gives the logits trainlab's model gives.

Nothing is deleted that the export did not write (config.export_target): the folder is written
whole into ``hf_model.partial`` beside it, recorded (trainlab_export.json), and renamed into
place; an earlier folder at ``out_dir`` is replaced only when it is this trial's own untouched
export. The driver refused every other case before the trial started; rank 0 checks again
before it writes and before it renames (a file may have appeared since).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from trainlab.config.export_target import replace_reason, staging_folder, write_record
from trainlab.config.schema import ModelConfig
from trainlab.distributed import gather_strings
from trainlab.models.hf import hf_config
from trainlab.models.hf_weights import pretrained_state


class ExportRefused(RuntimeError):
    """The export would replace something it did not write: nothing was replaced."""


@torch.no_grad()
def export_hf(model: nn.Module | Iterable[nn.Module], *, cfg: ModelConfig, out_dir: str | Path,
              trial_hash: str, tokenizer: str = "") -> Path:
    """Save `model` (as trained, in whatever layout) to `out_dir`; every rank of the process group
    calls it. `tokenizer`: a local tokenizer folder saved beside the weights ("" = none).
    `trial_hash`: the trial's config hash, recorded in the folder (whose export it is)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    distributed = dist.is_available() and dist.is_initialized()
    rank0 = not distributed or dist.get_rank() == 0
    out = Path(out_dir)
    staging = staging_folder(out)
    problem = _stage(out, staging, trial_hash=trial_hash) if rank0 else ""
    problem = gather_strings(problem)[0]  # rank 0's verdict, on every rank
    if problem:
        raise ExportRefused(problem)
    state = {key: t.detach() for key, t in pretrained_state(model).items()}
    writer = dcp.HuggingFaceStorageWriter(str(staging), save_distributed=distributed,
                                          enable_consolidation=distributed)
    dcp.save(state, storage_writer=writer, no_dist=not distributed)
    if rank0:
        sharded = staging / "sharded"
        if sharded.is_dir():
            shutil.rmtree(sharded)  # the per-rank files consolidation read (written by this export)
        config = hf_config(cfg)
        config.use_cache = True  # as transformers saves it: generation uses the cache
        config.save_pretrained(staging)
        if tokenizer:
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(tokenizer, local_files_only=True,
                                          trust_remote_code=False).save_pretrained(staging)
        write_record(staging, trial_hash=trial_hash)
        problem = _swap_in(staging, out, trial_hash=trial_hash)
    problem = gather_strings(problem)[0]
    if problem:
        raise ExportRefused(problem)
    return out


def _stage(out: Path, staging: Path, *, trial_hash: str) -> str:
    """Rank 0: an empty staging folder beside `out`, recorded as this trial's partial export; or why
    not (the target or the staging folder holds what this export may not replace)."""
    for folder, partial in ((out, False), (staging, True)):
        why = replace_reason(folder, trial_hash=trial_hash, partial=partial)
        if why:
            return (f"train.export=hf: {folder} {why}; nothing was replaced: move it away, or run again "
                    "with another output_dir")
    if staging.exists():
        shutil.rmtree(staging)  # this trial's own export, cut off before its rename
    staging.mkdir(parents=True)
    write_record(staging, trial_hash=trial_hash, partial=True)
    return ""


def _swap_in(staging: Path, out: Path, *, trial_hash: str) -> str:
    """Rank 0: rename the finished export to `out`, replacing only this trial's own earlier export;
    or why not (the new export then stays in `staging`)."""
    why = replace_reason(out, trial_hash=trial_hash)
    if why:
        return f"train.export=hf: {out} {why}; the export is in {staging} and nothing was replaced"
    if not os.path.lexists(out):
        staging.rename(out)
        return ""
    old = out.with_name(out.name + ".old")
    if os.path.lexists(old):
        return f"train.export=hf: {old} is in the way of replacing {out}; the export is in {staging}"
    out.rename(old)
    staging.rename(out)
    shutil.rmtree(old)  # this trial's own earlier export, untouched since (replace_reason)
    return ""


__all__ = ["ExportRefused", "export_hf"]
