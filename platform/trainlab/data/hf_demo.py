"""A local tokenizer and dataset for data=hf made from the embedded corpus, with nothing downloaded:
fixtures for tests and for a `trainlab hf-demo` command.

    train_demo_tokenizer(DIR)   a byte-level BPE trained on the Python language reference
                                (data.text.reference_text), saved so that
                                AutoTokenizer.from_pretrained(DIR, local_files_only=True) loads it,
                                with <s>, </s>, <pad> and a small chat template
    write_demo_dataset(DIR)     DIR/docs.jsonl (one paragraph group of the reference per row, `text`)
                                and DIR/chat.jsonl (short conversations, `messages`)

Both take well under a second (transformers is not imported: the files are written directly).
"""

from __future__ import annotations

import json
from pathlib import Path

from trainlab.data.text import reference_text

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' }}\n{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}\n{% endif %}"
)
"""Each turn '<|role|>\\ncontent'; an assistant turn ends with EOS (so its answer teaches stopping)."""
DEMO_VOCAB_SIZE = 512


def train_demo_tokenizer(out_dir, *, vocab_size: int = DEMO_VOCAB_SIZE) -> Path:
    """Train a byte-level BPE of `vocab_size` ids (special tokens included) on the embedded corpus
    and save it to `out_dir` as a PreTrainedTokenizerFast folder; returns the folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = [PAD, BOS, EOS, *ROLE_TOKENS]
    if vocab_size < 256 + len(specials):
        raise ValueError(f"vocab_size={vocab_size} cannot hold the 256 bytes and {len(specials)} special "
                         f"tokens; use vocab_size >= {256 + len(specials)}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([reference_text()], trainer=trainer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
              "pad_token": PAD, "additional_special_tokens": list(ROLE_TOKENS),
              "chat_template": CHAT_TEMPLATE, "model_max_length": 1 << 20, "clean_up_tokenization_spaces": False}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "additional_special_tokens": list(ROLE_TOKENS)},
        indent=1) + "\n")
    return out


def demo_documents(*, paragraphs_per_doc: int = 8) -> list[str]:
    """The embedded corpus cut into documents of `paragraphs_per_doc` blank-line paragraphs each."""
    paragraphs = [p for p in reference_text().split("\n\n") if p.strip()]
    return ["\n\n".join(paragraphs[i:i + paragraphs_per_doc]) for i in range(0, len(paragraphs), paragraphs_per_doc)]


def demo_conversations(num: int = 64) -> list[list[dict]]:
    """`num` short conversations: a user asks about a paragraph's first line, the assistant answers
    with the paragraph (one in four has a system turn, one in three a second exchange)."""
    paragraphs = [p.strip() for p in reference_text().split("\n\n") if len(p.strip()) > 80][:2 * num]
    out = []
    for i in range(num):
        a, b = paragraphs[2 * i % len(paragraphs)], paragraphs[(2 * i + 1) % len(paragraphs)]
        conv = [{"role": "system", "content": "Answer from the Python reference."}] if i % 4 == 0 else []
        conv += [{"role": "user", "content": f"What follows: {a.splitlines()[0][:60]}?"},
                 {"role": "assistant", "content": a[:400]}]
        if i % 3 == 0:
            conv += [{"role": "user", "content": "And next?"}, {"role": "assistant", "content": b[:300]}]
        out.append(conv)
    return out


def write_demo_dataset(out_dir) -> dict[str, Path]:
    """Write docs.jsonl (`text` rows) and chat.jsonl (`messages` rows) under `out_dir`; returns
    {"docs": path, "chat": path}."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    docs, chat = out / "docs.jsonl", out / "chat.jsonl"
    docs.write_text("".join(json.dumps({"text": d}) + "\n" for d in demo_documents()))
    chat.write_text("".join(json.dumps({"messages": c}) + "\n" for c in demo_conversations()))
    return {"docs": docs, "chat": chat}
