"""What a command prints is trainlab's to say: torchao's kernel-loading lines, its note that Triton
is missing, torch's pytree deprecation and GradScaler's 'CUDA is not available' never come before
the estimate's own first line, and a warning that quotes a setting shows its square brackets."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from conftest import trainlab_cmd


@pytest.mark.parametrize("args", [["precision=fp8_tensorwise"], ["precision=fp16", "cluster.nodes=[2xA100]"]],
                         ids=["fp8_here", "fp16_on_gpus"])
def test_the_estimate_prints_its_own_lines_first(args, tmp_path):
    out = subprocess.run(trainlab_cmd("estimate", "model=tiny", *args), cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    said = (out.stderr + out.stdout).strip().splitlines()
    assert said[0].startswith("model=tiny "), said[:5]
    for noise in ("Failed to load", "Detected no triton", "natively supported", "GradScaler", "CUDA is not available"):
        assert noise not in out.stdout + out.stderr


def test_only_the_named_records_are_dropped():
    import trainlab  # noqa: F401 - installs the filters
    from trainlab.vocab.quiet import DROPPED

    logger = logging.getLogger("torchao")
    kept = logging.LogRecord("torchao", logging.WARNING, __file__, 1, "Float8 needs a newer GPU", None, None)
    dropped = logging.LogRecord("torchao", logging.WARNING, __file__, 1, DROPPED["torchao"][0] + "x.so", None, None)
    assert logger.filter(kept) and not logger.filter(dropped)


def test_a_warning_shows_a_setting_with_square_brackets_as_written():
    code = ("from trainlab.console import warn; "
            "warn('set precision.keep_hp=[output,unaligned] to study FP8 numerics; [bold]not markup[/]')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "warning: set precision.keep_hp=[output,unaligned] to study FP8 numerics; [bold]not markup[/]" \
        in out.stdout, out.stdout + out.stderr
