"""Layers only call downward (DESIGN.md): the packages the engine builds on never import the
engine, the launcher or anything above them, so each can be used, and tested, without them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import trainlab

PACKAGE = Path(trainlab.__file__).parent
BELOW_ENGINE = ("distributed.py", "devices.py", "events.py", "names.py", "config", "models", "data", "precision", "parallel", "telemetry")
"""Modules and packages under the engine (the engine and the launcher use them, never the reverse)."""
ABOVE = ("trainlab.engine", "trainlab.launch", "trainlab.compare", "trainlab.bench", "trainlab.cli",
         "trainlab.train", "trainlab.jobs", "trainlab.tracking")


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in `path`, at any depth (imports inside functions count)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out += [(node.lineno, node.module)]
    return out


def modules_of(part: str) -> list[Path]:
    path = PACKAGE / part
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


@pytest.mark.parametrize("part", BELOW_ENGINE)
def test_lower_layers_import_nothing_above_them(part):
    upward = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
              for path in modules_of(part) for line, module in imported(path)
              if any(module == up or module.startswith(up + ".") for up in ABOVE)]
    assert not upward, "\n".join(upward)


def test_the_process_group_helpers_sit_below_parallel_and_telemetry():
    """parallel/ and telemetry/ use them, so they live in trainlab.distributed, not in the engine."""
    users = {path.relative_to(PACKAGE).parts[0] for part in ("parallel", "telemetry")
             for path in modules_of(part) if any(m == "trainlab.distributed" for _, m in imported(path))}
    assert users == {"parallel", "telemetry"}
    assert not (PACKAGE / "engine" / "distributed.py").exists()
