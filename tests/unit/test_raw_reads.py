"""No file is read outside trainlab.vocab.files except where the list below says why: a new
`open(...)`, `.read_text()`, `json.load`, `np.memmap`, `torch.load`, `OmegaConf.load` ... of a
path a user can name must go through the checked reader (issue 28: reads). Found by parsing
(ast), so a docstring that mentions torch.load is not a read."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "platform" / "trainlab"

ALLOWED = {
    # (file under trainlab/, what it calls): (how many, why it may)
    ("vocab/files.py", "open"): (1, "the checked reader itself (an fd it has fstat-ed)"),
    ("telemetry/peak_memory.py", "read_text"): (1, "/proc/self/status: the kernel's, never a user's path"),
    ("launch/interfaces.py", "open"): (1, "/proc/net/if_inet6: the kernel's"),
    ("engine/integrity.py", "open"): (1, "checkpoint shards, after check_checkpoint matched each to "
                                         "its manifest (a regular file of the recorded size)"),
    ("engine/checkpoint.py", "torch.load"): (1, "a rank file, after the same manifest check"),
    ("engine/run.py", "read_text"): (1, "a counter trainlab writes in its own run folder (is_file)"),
    ("compare/html_report.py", "read_bytes"): (1, "a plot compare has just written"),
    ("data/token_file.py", "np.memmap"): (1, "after check_file (regular, bounded) and open_file"),
    ("data/hf_cache.py", "np.memmap"): (1, "the cache's mask file, after check_file (regular, bounded by "
                                           "the token count it must equal)"),
    ("tracking/store_check.py", "open"): (1, "a sqlite store opened r+b after _regular_store"),
    ("tracking/spill.py", "open"): (1, "_locked: appends, and the removal after check() read it"),
    ("redact.py", "read_text"): (1, "files Hydra itself wrote in the run folder, rewritten masked"),
    ("tracking/study_owner.py", "open"): (1, "a study's lock file in trainlab's own cache folder, opened to "
                                              "flock it; its holder line read back only for the message"),
}
"""bench/ is left out: benchmarks read back the files they wrote."""

_MODULE_LOADS = {("json", "load"), ("torch", "load"), ("np", "load"), ("np", "fromfile"), ("np", "memmap"),
                 ("numpy", "load"), ("OmegaConf", "load"), ("yaml", "load"), ("yaml", "safe_load"),
                 ("pickle", "load"), ("safetensors", "load_file")}


def _writes(call: ast.Call, mode_at: int) -> bool:
    """open(..., mode) / path.open(mode) with a constant mode that only writes or appends."""
    mode = call.args[mode_at] if len(call.args) > mode_at else next(
        (k.value for k in call.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and not set("r+") & set(mode.value)


def _reads(tree: ast.AST) -> Counter:
    found = Counter()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "open" and not _writes(node, 1):
            found["open"] += 1
        elif isinstance(f, ast.Attribute):
            owner = f.value.id if isinstance(f.value, ast.Name) else None
            if f.attr in ("read_text", "read_bytes"):
                found[f.attr] += 1
            elif (owner, f.attr) in _MODULE_LOADS:
                found[f"{owner}.{f.attr}"] += 1
            elif f.attr == "open" and (node.args or any(k.arg == "mode" for k in node.keywords)) \
                    and not _writes(node, 0) and isinstance((node.args or [None])[0], ast.Constant):
                found["open"] += 1  # path.open("rb"): a read; tracking.open(resuming=...) is no file
    return found


def test_every_raw_read_is_the_checked_reader_or_says_why():
    seen = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("bench/"):
            continue
        for what, n in _reads(ast.parse(path.read_text(), rel)).items():
            seen[(rel, what)] = n
    unexplained = {k: n for k, n in seen.items() if n > ALLOWED.get(k, (0, ""))[0]}
    assert not unexplained, (
        f"raw file reads outside trainlab.vocab.files: {unexplained}; read a user's path with "
        "vocab.files.read_text / open_file / check_file (kind and size checked, one error line), "
        "or add the call to ALLOWED with the reason it cannot be a user's FIFO, device or huge file")
    stale = sorted(k for k in ALLOWED if k not in seen)
    assert not stale, f"ALLOWED names reads that are gone: {stale}; remove them"
