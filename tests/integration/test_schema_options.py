"""The schemas check every group option's YAML but are no option themselves: `trainlab train
--help` lists the files of conf/<group>/ alone, `model=model_schema` is refused like any unknown
option, and a typo or a wrong type in an option's YAML is still refused at composition."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conftest import assert_refused, trainlab_cmd
from trainlab.config import CONF_DIR, GROUPS, ConfigError, register_configs
from trainlab.config.convert import schema_at
from trainlab.config.overrides import check_overrides


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _cli(args: list[str], env: dict, cwd: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The real command in `cwd`, and the Ray sessions it started (none, if it refused)."""
    with tempfile.TemporaryDirectory(prefix="tlschema-") as ray_tmp:
        proc = subprocess.run(trainlab_cmd("train", *args), cwd=cwd, capture_output=True, text=True,
                              timeout=120, env={**env, "RAY_TMPDIR": ray_tmp, "TMPDIR": ray_tmp})
        return proc, [str(p) for p in Path(ray_tmp).rglob("session_*")]


def test_help_lists_each_groups_files_and_no_schema(cli_env, tmp_path):
    proc = subprocess.run(trainlab_cmd("train", "--help"), cwd=tmp_path, env=cli_env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "_schema" not in proc.stdout, proc.stdout
    listed = dict(line.split(": ", 1) for line in proc.stdout.splitlines()
                  if ": " in line and line.split(":")[0] in GROUPS)  # `model: 125m, 1b, ...`
    assert {g: listed.get(g) for g in GROUPS} == {g: ", ".join(_options(g)) for g in GROUPS}


@pytest.mark.parametrize("group", GROUPS)
def test_a_schema_is_refused_as_an_option(group):
    with pytest.raises(ConfigError) as info:
        check_overrides([f"{group}={group}_schema"])
    assert f"{group}={group}_schema is not an option of {group}; choose one of" in str(info.value)
    assert _options(group)[0] in str(info.value)  # the real options are offered


def test_the_command_refuses_a_schema_as_an_option(cli_env, tmp_path):
    tiny = ["model=tiny", "train.max_steps=1", "tracking=none"]
    proc, sessions = _cli([*tiny, "model=model_schema"], cli_env, tmp_path)
    assert_refused(proc, ["model=model_schema", "is not an option of model", "tiny", "conf/model/"],
                   sessions=sessions)
    proc, sessions = _cli(["-m", *tiny, "precision=fp32,precision_schema"], cli_env, tmp_path)
    assert_refused(proc, ["precision=precision_schema", "is not an option of precision", "bf16"],
                   sessions=sessions)


def test_every_option_extends_its_schema():
    """Each option's YAML names its schema first; composed, the option's node is the schema's
    dataclass (the YAML was merged into it)."""
    for group in GROUPS:
        for option in _options(group):
            defaults = OmegaConf.load(CONF_DIR / group / f"{option}.yaml").get("defaults")
            assert defaults and defaults[0] == f"/{group}_schema@_here_", f"conf/{group}/{option}.yaml"
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for group in GROUPS:
            option = _options(group)[-1]
            cfg = compose(config_name="config", overrides=[f"{group}={option}"])
            assert OmegaConf.get_type(cfg[group]) is schema_at(group), f"{group}={option}"


@pytest.fixture
def conf_copy(tmp_path, cli_env) -> tuple[Path, dict]:
    """A copy of conf/ the command reads (TRAINLAB_CONF_DIR), to edit an option's YAML."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    return conf, {**cli_env, "TRAINLAB_CONF_DIR": str(conf)}


@pytest.mark.parametrize(("line", "says"), [
    ("dimm: 64", ["model/tiny", "model.dimm", "not in 'ModelConfig'"]),  # a typo'd key
    ("dim: wide", ["model/tiny", "model.dim", "'wide'", "Integer"]),      # a wrong type
])
def test_a_bad_line_in_an_option_yaml_is_refused(conf_copy, tmp_path, line, says):
    conf, env = conf_copy
    tiny = conf / "model" / "tiny.yaml"
    tiny.write_text(tiny.read_text().replace("\ndim: 64\n", f"\n{line}\n"))
    proc, sessions = _cli(["model=tiny", "train.max_steps=1", "tracking=none"], env, tmp_path)
    assert_refused(proc, says, sessions=sessions)


def test_an_option_naming_its_schema_the_old_way_is_told_the_new_way(conf_copy, tmp_path):
    conf, env = conf_copy
    tiny = conf / "model" / "tiny.yaml"
    tiny.write_text(tiny.read_text().replace("- /model_schema@_here_", "- model_schema"))
    proc, sessions = _cli(["model=tiny", "train.max_steps=1", "tracking=none"], env, tmp_path)
    assert_refused(proc, ["model/tiny", "- model_schema", "write '- /model_schema@_here_'"],
                   sessions=sessions)
