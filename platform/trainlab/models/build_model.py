"""Config -> model."""

from __future__ import annotations

from torch import nn

from trainlab.config.schema import ModelConfig
from trainlab.models.args import resolve_dims
from trainlab.models.transformer import Transformer


def build_model(cfg: ModelConfig, *, vocab_size: int, shapes_only: bool = False) -> nn.Module:
    """Build and initialize a `Transformer` from the `model` config section (model=hf: the
    Hugging Face model its config.json describes, models.hf.HFCausalLM).

    Args:
        cfg: the `model` section (ModelConfig, or a DictConfig/dict of one).
        vocab_size: the corpus's vocabulary size; used when ``model.vocab_size`` is 0.
        shapes_only: names and shapes are all the caller reads (a check): model=custom stays
            on the meta device even when it cannot initialise itself there.

    Raises:
        ValueError: ``model.vocab_size`` is set but smaller than the corpus vocabulary.

    Parameters are float32 on the current default device (wrap the call in
    ``torch.device("meta")`` to size a model without allocating it). Seed with
    ``torch.manual_seed`` first for a reproducible init.
    """
    if cfg._target_:
        from trainlab.models.custom import build_custom

        return build_custom(cfg, vocab_size=vocab_size, shapes_only=shapes_only)
    if cfg.name == "hf":
        from trainlab.models.hf import build_hf_model

        return build_hf_model(cfg, vocab_size=vocab_size)
    return Transformer(resolve_dims(cfg, vocab_size=vocab_size))
