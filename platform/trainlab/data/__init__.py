"""Corpora (text, markov, token files, local Hugging Face datasets) and deterministic data-parallel batching."""

from trainlab.data.batches import TokenBatches, val_batches
from trainlab.data.build_corpus import build_corpus
from trainlab.data.corpus import Corpus
from trainlab.data.token_file import write_token_file

__all__ = ["Corpus", "TokenBatches", "build_corpus", "val_batches", "write_token_file"]
