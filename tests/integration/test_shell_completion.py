"""Bash completion through the real hook: bash evals what `trainlab train -sc install=bash`
prints (Hydra's hook), then calls the completion function it registered for `trainlab` with
COMP_WORDS/COMP_CWORD/COMP_LINE/COMP_POINT set as bash sets them at a TAB, and reads COMPREPLY.
The hook runs `trainlab -sc query=bash` with COMP_LINE in its environment, as it does for a user.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import trainlab_cmd

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _env(cli_env: dict) -> dict:
    # the hook finds the program by its first word (`command -v trainlab`), as in a user's shell
    return {**cli_env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{cli_env.get('PATH', '')}"}


def _hook_script(install: list[str]) -> str:
    return (f'eval "$({shlex.join(install)})"\n'
            # the function `complete -p trainlab` names (`... -F FUNCTION trainlab`)
            'spec=$(complete -p trainlab) || { echo "no completion for trainlab" >&2; exit 3; }\n'
            'fn=${spec##*-F }; fn=${fn%% *}\n')


def complete(line: str, env: dict, *, install: list[str] | None = None) -> list[str]:
    """COMPREPLY for a TAB at the end of `line`. '=' is not a word break once the hook is
    installed (it removes it from COMP_WORDBREAKS), so bash's words are the blank-separated ones."""
    words = line.split() + ([""] if line.endswith(" ") else [])
    script = _hook_script(install or trainlab_cmd("train", "-sc", "install=bash")) + (
        f"COMP_LINE={shlex.quote(line)}; COMP_POINT={len(line)}\n"
        f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        'COMPREPLY=(); "$fn"\n'
        'printf "%s\\n" "${COMPREPLY[@]}"\n')
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [c for c in proc.stdout.splitlines() if c]


def test_the_installed_hook_completes_groups_options_and_keys(cli_env):
    env = _env(cli_env)
    assert "precision=" in complete("trainlab train prec", env)
    options = complete("trainlab train precision=", env)
    assert {"precision=bf16", "precision=fp32", "precision=fp8_tensorwise"} <= set(options), options
    assert all(c.startswith("precision=") for c in options), options
    assert "precision=precision_schema" not in options  # the schema is no option (config.schema)
    assert complete("trainlab train precision=fp8_r", env) == ["precision=fp8_rowwise",
                                                                "precision=fp8_rowwise_gw_hp"]
    assert "train.max_steps=" in complete("trainlab train train.max_", env)
    everything = complete("trainlab train ", env)  # a new word: every group and top-level key
    assert {"model=", "parallel=", "precision=", "seed="} <= set(everything), everything


def test_completion_follows_the_words_before_it(cli_env):
    """Earlier overrides and -m are part of what is composed (a key another option sets)."""
    env = _env(cli_env)
    assert complete("trainlab train -m model=tiny seed=0,1 precision=b", env) == [
        "precision=bf16", "precision=bf16_pure", "precision=bf16_pure_kahan", "precision=bf16_pure_plain",
        "precision=bf16_pure_stochastic"]
    # the composed value of a key is offered after '=' (model=tiny's width, not the default's)
    assert complete("trainlab train model=tiny model.dim=", env) == ["model.dim=64"]


def test_the_command_word_completes_to_subcommands_and_others_fall_back(cli_env):
    env = _env(cli_env)
    assert "train" in complete("trainlab ", env)
    assert complete("trainlab com", env) == ["compare"]
    # compare's own flags are argparse's: the hook offers nothing (bash falls back to file names)
    assert complete("trainlab compare --sw", env) == []


def test_installing_from_the_top_level_command_works_the_same(cli_env):
    """`trainlab -sc install=bash` and `trainlab train -sc install=bash` install the same hook,
    registered for `trainlab` alone (not for a command named `train`)."""
    env = _env(cli_env)
    top = trainlab_cmd("-sc", "install=bash")
    assert "precision=bf16" in complete("trainlab train precision=", env, install=top)
    for install in (top, trainlab_cmd("train", "-sc", "install=bash")):
        printed = subprocess.run(install, env=env, capture_output=True, text=True, timeout=120)
        assert printed.returncode == 0, printed.stderr
        assert printed.stdout.rstrip().endswith("-F hydra_bash_completion trainlab"), printed.stdout[-300:]


def test_a_query_outside_the_hook_is_one_error_line(cli_env):
    env = {k: v for k, v in _env(cli_env).items() if k not in ("COMP_LINE", "COMP_POINT")}
    proc = subprocess.run(trainlab_cmd("-sc", "query=bash"), env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("error: "), proc.stderr
    assert "install=bash" in proc.stderr


def test_estimate_completes_the_overrides_train_does(cli_env):
    """`trainlab estimate` takes train's overrides: the same hook completes them, its own keys too."""
    env = _env(cli_env)
    assert complete("trainlab est", env) == ["estimate"]
    assert complete("trainlab estimate -m model=tiny precision=fp8_r", env) == [
        "precision=fp8_rowwise", "precision=fp8_rowwise_gw_hp"]
    # a list key as Hydra offers one: its name and a dot (cluster.nodes.)
    assert {"cluster.nodes.", "cluster.network_gb_s=", "cluster.nvlink_gb_s="} <= set(
        complete("trainlab estimate cluster.n", env))
