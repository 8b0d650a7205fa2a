"""``build_corpus``: turn a :class:`DataConfig` into a :class:`Corpus`."""

from __future__ import annotations

import os

from trainlab.config.schema import DATASETS, DataConfig
from trainlab.data.corpus import Corpus
from trainlab.data.hf_corpus import hf_corpus, hf_vocab_size
from trainlab.data.markov import markov_corpus
from trainlab.data.text import VOCAB_SIZE, text_corpus
from trainlab.data.token_file import token_file_corpus


def build_corpus(cfg: DataConfig) -> Corpus:
    """Build the corpus ``cfg.name`` names (text and markov are cached per process)."""
    # Arguments go to the cached builders as plain hashable values, never the config object.
    if cfg.name == "text":
        return text_corpus(val_fraction=float(cfg.val_fraction))
    if cfg.name == "markov":
        return markov_corpus(
            vocab_size=int(cfg.vocab_size),
            num_tokens=int(cfg.num_tokens),
            concentration=float(cfg.concentration),
            seed=int(cfg.seed),
            val_fraction=float(cfg.val_fraction),
        )
    if cfg.name == "tokens":
        return token_file_corpus(
            path=os.path.expanduser(str(cfg.path)),  # as the driver's preflight reads it
            dtype=str(cfg.token_dtype),
            vocab_size=int(cfg.vocab_size),
            val_fraction=float(cfg.val_fraction),
        )
    if cfg.name == "hf":
        return hf_corpus(cfg)
    raise ValueError(f"data.name={cfg.name!r} is not known; choose one of {', '.join(DATASETS)}")


def corpus_vocab_size(cfg: DataConfig) -> int:
    """The vocabulary `build_corpus(cfg)` would have, without building it (for estimates):
    text is byte-level; markov and tokens have data.vocab_size; hf has its tokenizer's."""
    if cfg.name == "hf":
        return hf_vocab_size(cfg)
    return VOCAB_SIZE if cfg.name == "text" else int(cfg.vocab_size)
