"""Layers only call downward (DESIGN.md): import-linter's contracts in pyproject.toml hold.

The contracts (one layers contract over every top-level module of trainlab, the engine and
everything below it free of Ray and MLflow, the app never importing its Hydra plugin) are
checked by `lint-imports`, run here from the repository root so the README's test command
checks them too, as CI does after ruff.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_are_kept():
    lint = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    # this checkout's package (platform/) is the one analysed, not an installed copy elsewhere
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "platform"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([lint, "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout and "BROKEN" not in done.stdout
