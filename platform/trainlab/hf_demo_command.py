"""`trainlab hf-demo DIR`: a tiny local Hugging Face model, its tokenizer and datasets, made here.

    trainlab hf-demo hf_demo                  # hf_demo/model (tokenizer inside), hf_demo/data
    trainlab hf-demo hf_demo --family qwen2

What the README's "your model and your data" commands train on when you have none of your own:
a BPE tokenizer trained on the embedded corpus, a 2-layer model of width 64 with that vocabulary
saved by transformers' save_pretrained (its weights a seeded random init: fine-tuning it is
pre-training a tiny model), and the corpus as a jsonl of documents and one of chat turns.
Nothing downloads; it takes a few seconds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainlab.config.hf_model import HF_FAMILIES, TESTED_OTHER_FAMILIES


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainlab hf-demo", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="folder to write (model/ and data/ inside); must be new or empty")
    p.add_argument("--family", default="llama", choices=(*HF_FAMILIES, *TESTED_OTHER_FAMILIES),
                   help="the model's architecture")
    p.add_argument("--seed", type=int, default=0, help="seed of the model's random weights")
    return p


def make_demo(out: Path, *, family: str = "llama", seed: int = 0) -> dict[str, Path]:
    """Write the demo to `out`; returns its paths (model, docs, chat)."""
    from trainlab.data.hf_demo import train_demo_tokenizer, write_demo_dataset
    from trainlab.models.hf_demo import write_demo_model

    model_dir = out / "model"
    train_demo_tokenizer(model_dir)
    from transformers import AutoTokenizer

    vocab_size = len(AutoTokenizer.from_pretrained(model_dir, local_files_only=True))
    write_demo_model(model_dir, family=family, vocab_size=vocab_size, seed=seed)
    data = write_demo_dataset(out / "data")
    return {"model": model_dir, **data}


def main(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        print(f"trainlab hf-demo: {out} exists and is not an empty folder; name a new folder", file=sys.stderr)
        sys.exit(2)
    print(f"making a {args.family} demo model, tokenizer and datasets in {out} ...", flush=True)
    paths = make_demo(out, family=args.family, seed=args.seed)
    model, docs = paths["model"], paths["docs"]
    print(f"model and tokenizer: {model}\ndocuments: {docs}\nchat: {paths['chat']}\n\nnext, a sweep on it:\n"
          f"  trainlab train -m model=hf model.pretrained={model} data=hf data.path={docs} "
          f"data.tokenizer={model} precision=fp32,bf16 parallel=ddp,fsdp cluster.num_workers=2 "
          f"train.max_steps=60 train.export=hf sweep_name=hf_demo")


__all__ = ["main", "make_demo"]
