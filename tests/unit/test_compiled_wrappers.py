"""A whole model under torch.compile inside DDP: the wrappers are looked through without
asking their truth value (torch.compile's wrapper answers bool() with len() of the model,
which raised "Transformer does not support len()" for train.compile=true, compile_unit=model
on several DDP ranks)."""

from __future__ import annotations

import torch
from torch import nn

from trainlab.config import compose_run_config
from trainlab.models import build_model
from trainlab.models.init import materialize
from trainlab.parallel import unwrap


class Wrapper(nn.Module):
    """DDP's shape: the wrapped model under `module`."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module


def test_compiled_model_inside_a_wrapper_is_unwrapped_and_materialized():
    run = compose_run_config(["model=tiny"])
    with torch.device("meta"):
        model = build_model(run.model, vocab_size=64)
    wrapped = Wrapper(torch.compile(model))
    assert unwrap(wrapped) is model
    materialize(wrapped, device="cpu", seed=0)
    assert not any(p.is_meta for p in model.parameters())
