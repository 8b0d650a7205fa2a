"""What the data=hf tests share: the demo tokenizer and datasets made once per module, the config
that reads them, and a refusal as the driver meets it (one line, data.cache_dir left as it was)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from trainlab.config.schema import DataConfig
from trainlab.data.hf_corpus import prepare_hf
from trainlab.data.hf_demo import train_demo_tokenizer, write_demo_dataset


def make_demo(root) -> dict[str, str]:
    """{tokenizer, docs, chat}: the demo tokenizer folder and its two jsonl files, under `root`."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    return {"tokenizer": str(train_demo_tokenizer(root / "tok")),
            **{k: str(v) for k, v in write_demo_dataset(root / "data").items()}}


def data_cfg(demo, cache, **kw) -> DataConfig:
    return DataConfig(**{"name": "hf", "path": demo["docs"], "tokenizer": demo["tokenizer"],
                         "cache_dir": str(cache), **kw})


def stream(cached) -> np.ndarray:
    return np.asarray(cached.tokens)


def refused(cfg: DataConfig) -> str:
    """prepare_hf's refusal: one line; data.cache_dir is left as it was (no lock file added)."""
    cache = cfg.cache_dir
    before = sorted(os.listdir(cache)) if os.path.isdir(cache) else None
    with pytest.raises(ValueError) as e:
        prepare_hf(cfg)
    assert "\n" not in str(e.value)
    after = sorted(os.listdir(cache)) if os.path.isdir(cache) else None
    assert after == before or (before is None and after == []), f"the refusal left {after} in data.cache_dir"
    return str(e.value)
