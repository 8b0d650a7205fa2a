"""The architecture page's file list, generated: every module of trainlab, layer by layer.

    python docs/files.py            # print the list
    python docs/files.py --write    # put it into docs/pages/architecture.md, between its markers

The layers are read from the import-linter contract in pyproject.toml (the one CI enforces) and
each module's line is the first sentence of its docstring, so the page cannot drift from the code:
tests/unit/test_architecture_files.py fails, naming this command, when a module is added, moved
or renamed without running it.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "platform" / "trainlab"
PAGE = REPO / "docs" / "pages" / "architecture.md"
BEGIN, END = "<!-- files:begin (python docs/files.py --write) -->", "<!-- files:end -->"
MAX_FILE_BYTES = 1 << 20
"""A module larger than this is not one of ours: refused rather than parsed."""


def layers() -> list[list[str]]:
    """The layers contract's layers, bottom first, each a list of top-level module names."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["type"] == "layers"]
    return [re.split(r"\s*[:|]\s*", layer.strip()) for layer in reversed(contract["layers"])]


def summary(path: Path) -> str:
    """The first sentence of the module's docstring ('' without one): its first paragraph up to
    the first full stop, on one line."""
    if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
        raise ValueError(f"{path}: not a regular file of at most {MAX_FILE_BYTES} bytes")
    doc = ast.get_docstring(ast.parse(path.read_text(), filename=str(path))) or ""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    end = re.search(r"\.( |$)", paragraph)
    return paragraph[:end.start() + 1] if end else paragraph


def modules_of(name: str) -> list[Path]:
    """The files of top-level module `name`: itself, or its package's modules (__init__ first)."""
    single = PACKAGE / f"{name}.py"
    if single.is_file():
        return [single]
    return sorted((PACKAGE / name).rglob("*.py"), key=lambda p: (p.parent != PACKAGE / name, str(p)))


def file_list() -> str:
    """The generated block: one section per layer (bottom first), one line per module."""
    out = []
    for number, layer in enumerate(layers(), start=1):
        out += ["", f"**Layer {number}: {', '.join(layer)}**", "", "| file | what it holds |", "|---|---|"]
        for name in layer:
            for path in modules_of(name):
                rel = path.relative_to(PACKAGE).as_posix()
                text = summary(path).replace("|", "\\|")
                out.append(f"| `{rel}` | {text} |")
    return "\n".join(out) + "\n"


def page_with(text: str, block: str) -> str:
    """`text` with the block between the markers replaced by `block`."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + block + "\n" + text[end:]


def main(argv: list[str]) -> None:
    block = file_list()
    if argv == ["--write"]:
        PAGE.write_text(page_with(PAGE.read_text(), block))
    elif not argv:
        sys.stdout.write(block)
    else:
        sys.exit("usage: python docs/files.py [--write]")


if __name__ == "__main__":
    main(sys.argv[1:])
