"""Config -> model."""

from __future__ import annotations

from trainlab.config.schema import ModelConfig
from trainlab.models.args import resolve_dims
from trainlab.models.transformer import Transformer


def build_model(cfg: ModelConfig, *, vocab_size: int) -> Transformer:
    """Build and initialize a `Transformer` from the `model` config section.

    Args:
        cfg: the `model` section (ModelConfig, or a DictConfig/dict of one).
        vocab_size: the corpus's vocabulary size; used when ``model.vocab_size`` is 0.

    Raises:
        ValueError: ``model.vocab_size`` is set but smaller than the corpus vocabulary.

    Parameters are float32 on the current default device (wrap the call in
    ``torch.device("meta")`` to size a model without allocating it). Seed with
    ``torch.manual_seed`` first for a reproducible init.
    """
    return Transformer(resolve_dims(cfg, vocab_size=vocab_size))
