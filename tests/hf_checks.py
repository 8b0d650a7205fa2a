"""What the model=hf layout tests compare with transformers itself: its loss on the first batch
trainlab draws, its logits of a saved folder, and the overrides that make a trial export."""

from __future__ import annotations

from pathlib import Path

import torch

RUN = ["model=hf", "data=text", "train.max_steps=4", "train.global_batch_size=8", "train.micro_batch_size=2",
       "train.seq_len=32", "train.eval_every=2", "train.eval_batches=4", "optim.warmup_steps=1",
       "optim.eps=1e-6", "train.numerics_every=0"]
"""A short fp32 fine-tune of a tiny model on the embedded text, the same for every layout."""

TOKENS = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))


def export_overrides(exports: Path, case: str) -> list[str]:
    """A trial that exports what it trained to <exports>/<case>/hf_model."""
    return ["train.export=hf", f"output_dir={exports / case}"]


def transformers_first_loss(overrides: list[str], folder: Path) -> float:
    """transformers' own forward and loss of the model saved in `folder` on the first global batch the
    run `overrides` describes draws: what trainlab's step-0 loss must be."""
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    from trainlab.config import compose_run_config
    from trainlab.data.batches import TokenBatches
    from trainlab.data.build_corpus import build_corpus

    run = compose_run_config(overrides)
    t = run.train
    batch = TokenBatches(build_corpus(run.data).train, seq_len=t.seq_len, global_batch_size=t.global_batch_size,
                         micro_batch_size=t.global_batch_size, dp_rank=0, dp_size=1, seed=run.seed).next_step()
    (inputs, targets), = batch
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return F.cross_entropy(model(input_ids=inputs).logits.flatten(0, 1), targets.flatten()).item()


def transformers_logits(folder: Path) -> torch.Tensor:
    """The logits transformers' from_pretrained(folder) gives for TOKENS."""
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)(input_ids=TOKENS).logits
