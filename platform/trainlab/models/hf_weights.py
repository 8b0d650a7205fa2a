"""model.pretrained: a Hugging Face checkpoint's weights into the model as it trains, sharded or split.

    materialize(model, device=..., seed=...)       # storage and a random init (models.init)
    load_pretrained(model, "/models/llama-1b")     # then every parameter from the safetensors

torch.distributed.checkpoint reads the safetensors files (HuggingFaceStorageReader) into the
parameters this rank holds, whatever they are: a whole tensor (one process, DDP), an FSDP2 or
tensor-parallel DTensor shard (each rank reads only its slice of the file: no rank holds the
whole model), or a pipeline stage's blocks. Names map one to one (the model's checkpoint_key); the dtype
is cast to the parameter's (a bf16 checkpoint into fp32 masters). Every rank of the process
group calls it (the load plans collectively).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from trainlab.config.hf_model import local_folder
from trainlab.config.safetensors_header import TensorEntry, check_index, read_header
from trainlab.models.init import model_roots

SAFETENSORS_MAX_BYTES = 1 << 42
"""4 TiB per file: far above any shard transformers writes (5 GB by default)."""


def weight_files(folder: str, *, field: str = "model.pretrained") -> list[Path]:
    """The safetensors files of a save_pretrained folder, each checked to be a regular file of a
    sane size whose header agrees with it (config.safetensors_header: not cut short, not damaged),
    and the files a sharded model's index names all there; a folder without any (a PyTorch .bin
    checkpoint, an empty copy) is refused."""
    return _checked_files(folder, field=field)[0]


def checkpoint_tensors(folder: str, *, field: str = "model.pretrained") -> dict[str, TensorEntry]:
    """{tensor name: its file, dtype and shape} over every safetensors file of `folder`, from their
    headers alone (weight_files' checks first)."""
    return _checked_files(folder, field=field)[1]


def _checked_files(folder: str, *, field: str) -> tuple[list[Path], dict[str, TensorEntry]]:
    path = local_folder(folder, field=field)
    files = sorted(path.glob("*.safetensors"))
    fix = (f"save the model with transformers' save_pretrained (safetensors is its default) and set "
           f"{field} to that folder")
    if not files:
        found = ", ".join(sorted(p.name for p in path.iterdir())[:6]) or "nothing"
        raise ValueError(f"{field}={folder!r} holds no *.safetensors weights (found: {found}); {fix}")
    damaged = (f"copy the model folder again (an interrupted copy or download leaves a file short) or save it "
               f"again with transformers' save_pretrained, and set {field} to it")
    tensors: dict[str, TensorEntry] = {}
    for f in files:
        tensors.update(read_header(f, field=field, fix=damaged, max_bytes=SAFETENSORS_MAX_BYTES))
    check_index(path, files, field=field, fix=damaged)
    return files, tensors


def pretrained_state(model: nn.Module | Iterable[nn.Module]) -> dict[str, torch.Tensor]:
    """Checkpoint key -> the parameter (or its shard) this rank holds, for every root of `model`."""
    state: dict[str, torch.Tensor] = {}
    for root in model_roots(model):
        for name, param in root.named_parameters():
            state[root.checkpoint_key(name)] = param
    return state


@torch.no_grad()
def load_pretrained(model: nn.Module | Iterable[nn.Module], folder: str) -> int:
    """Overwrite every parameter this rank holds with the checkpoint's values; returns how many
    parameters were loaded. A name the checkpoint lacks raises (KeyError from the planner)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    weight_files(folder)
    state = pretrained_state(model)
    reader = dcp.HuggingFaceStorageReader(os.path.expanduser(folder))
    dcp.load(state, storage_reader=reader, no_dist=not (dist.is_available() and dist.is_initialized()))
    return len(state)


__all__ = ["checkpoint_tensors", "load_pretrained", "pretrained_state", "weight_files"]
