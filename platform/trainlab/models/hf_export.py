"""train.export=hf: the trained model as transformers' save_pretrained folder, from any layout.

    export_hf(trainer.model, cfg=run.model, out_dir=".../hf_model", tokenizer="/tok")  # every rank

torch.distributed.checkpoint writes the parameters with HuggingFaceStorageWriter: every rank
its own shards (FSDP2, tensor parallel) or stages (pipeline), one copy of what is replicated,
consolidated into model.safetensors under the checkpoint's names (the model's checkpoint_key). Rank 0
adds config.json and the tokenizer, so ``AutoModelForCausalLM.from_pretrained(out_dir)`` loads
the trained model and gives the logits trainlab's model gives.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from trainlab.config.schema import ModelConfig
from trainlab.models.hf import hf_config
from trainlab.models.hf_weights import pretrained_state


@torch.no_grad()
def export_hf(model: nn.Module | Iterable[nn.Module], *, cfg: ModelConfig, out_dir: str | Path,
              tokenizer: str = "") -> Path:
    """Save `model` (as trained, in whatever layout) to `out_dir`; every rank of the process group
    calls it. `tokenizer`: a local tokenizer folder saved beside the weights ("" = none)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    distributed = dist.is_available() and dist.is_initialized()
    rank0 = not distributed or dist.get_rank() == 0
    out = Path(out_dir)
    if rank0 and out.exists():
        shutil.rmtree(out)  # a rerun's export replaces the last one, never mixes with it
    if distributed:
        dist.barrier()
    state = {key: t.detach() for key, t in pretrained_state(model).items()}
    writer = dcp.HuggingFaceStorageWriter(str(out), save_distributed=distributed, enable_consolidation=distributed)
    dcp.save(state, storage_writer=writer, no_dist=not distributed)
    if rank0:
        sharded = out / "sharded"
        if sharded.is_dir():
            shutil.rmtree(sharded)  # the per-rank files consolidation read; model*.safetensors hold it all
        config = hf_config(cfg)
        config.use_cache = True  # as transformers saves it: generation uses the cache
        config.save_pretrained(out)
        if tokenizer:
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(tokenizer, local_files_only=True).save_pretrained(out)
    if distributed:
        dist.barrier()
    return out


__all__ = ["export_hf"]
