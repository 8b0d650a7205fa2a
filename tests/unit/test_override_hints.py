"""Command lines Hydra cannot read get the override to write instead, group options stay inside
conf/ (and sweeps/), and folders the run would write are proven writable before it starts;
all through trainlab.config.overrides.check_overrides, as `trainlab train` calls it."""

from __future__ import annotations

import os

import pytest

from conftest import read_only_dir
from trainlab.config import ConfigError, compose_run_config
from trainlab.config.folders import check_writable_dir
from trainlab.config.overrides import check_overrides

TINY = ["model=tiny", "train.max_steps=3"]


def _refused(args: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        check_overrides([*TINY, *args])
    msg = str(info.value)
    assert "\n" not in msg and "Lexer" not in msg and "^" not in msg, msg
    return msg


@pytest.mark.parametrize(("args", "says"), [
    (["--max_steps=5"], ["'--max_steps=5' is a flag", "write train.max_steps=5"]),
    (["--train.max_steps", "5"], ["write train.max_steps=VALUE"]),
    (["-seed=3"], ["write seed=3"]),
    (["model: small"], ["'model: small' is YAML", "write model=small"]),
    (["precision:bf16"], ["write precision=bf16"]),
    (["max_steps"], ["'max_steps' is not an override", "train.max_steps=VALUE"]),
    (["vocab_size"], ["model.vocab_size=VALUE or data.vocab_size=VALUE"]),
    (["model"], ["'model' is not an override", "model=OPTION", "tiny", "small"]),
    # the shell cut `data.path=my file.bin` at the space: quoting is the fix, and Hydra takes both forms
    (["data=tokens", "data.path=my", "file.bin"], ["'file.bin'", "'data.path=my file.bin'",
                                                   "data.path=\"'my file.bin'\""]),
    (["data.path=a=b"], ["data.path", "quote it", "\"data.path='a=b'\""]),
    (["tracking.run_name=ünï"], ["Hydra reads text other than ASCII only inside quotes",
                                 "\"tracking.run_name='ünï'\""]),
    (["tracking.run_name=a\nb"], ["tracking.run_name='a\\nb' holds a control character", "remove it"]),
])
def test_an_unreadable_override_gets_what_to_write_instead(args, says):
    msg = _refused(args)
    for part in says:
        assert part in msg, msg


def test_the_quoting_the_messages_suggest_is_what_hydra_takes():
    """The forms the split-path message offers compose to the path with its space."""
    for form in ("data.path=my file.bin", "data.path='my file.bin'"):
        run = compose_run_config([*TINY, form])
        assert run.data.path == "my file.bin"


def test_a_removed_group_names_its_options():
    with pytest.raises(ConfigError) as info:
        compose_run_config(["~model"])
    msg = str(info.value)
    assert "model.name is not set" in msg and "`~model`" in msg and "model=OPTION" in msg and "tiny" in msg


@pytest.mark.parametrize("args", [
    ["model=../../../elsewhere/evil"],
    ["model=/etc/evil"],
    ["model=tiny/../../x"],
    ["precision=..\\x"],
    ["+sweep=../../../x/evil"],
    ["-m", "model=tiny,../../x/evil"],
    ["model=../../x/evil", "model=tiny"],  # a later override does not excuse an earlier one
])
def test_group_options_cannot_leave_the_config_tree(args):
    msg = _refused(args)
    group = "sweep" if "sweep" in args[0] else "precision" if "precision" in args[0] else "model"
    assert f"is not an option of {group}" in msg, msg
    assert "choose one of" in msg, msg
    assert ("sweeps/sweep/" if group == "sweep" else f"conf/{group}/") in msg, msg


def test_an_option_from_outside_would_otherwise_compose(tmp_path):
    """The hole exists: Hydra itself composes a YAML reached with '..' (so the check is needed)."""
    from hydra import compose, initialize_config_dir

    from trainlab.config.convert import CONF_DIR
    from trainlab.config.schema import register_configs

    (tmp_path / "evil.yaml").write_text("defaults:\n  - /model_schema@_here_\n  - _self_\nname: evil\n")
    rel = os.path.relpath(tmp_path / "evil", CONF_DIR / "model")
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        assert compose(config_name="config", overrides=[f"model={rel}"]).model.name == "evil"


# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "key"), [
    (["hydra.run.dir=/proc/trainlab-nope"], "hydra.run.dir"),
    (["-m", "hydra.sweep.dir=/proc/trainlab-nope", "seed=1,2"], "hydra.sweep.dir"),
])
def test_hydra_folder_that_cannot_be_made_is_refused_before_hydra_runs(args, key):
    msg = _refused(args)
    assert f"{key}='/proc/trainlab-nope'" in msg and f"set {key} to a folder you can write" in msg


def test_a_writable_folder_passes_and_nothing_is_left_behind(tmp_path):
    check_writable_dir(key="output_dir", path=str(tmp_path / "a" / "b"), fix="-")
    assert list(tmp_path.iterdir()) == []  # made to prove it, then removed
    (tmp_path / "kept").mkdir()
    check_writable_dir(key="output_dir", path=str(tmp_path / "kept"), fix="-")
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and not list((tmp_path / "kept").iterdir())


def test_a_file_in_the_way_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "file", tmp_path / "file" / "sub"):
        with pytest.raises(ValueError, match=r"output_dir=.*Not a directory.*choose"):
            check_writable_dir(key="output_dir", path=str(path), fix="choose another")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_name_too_long_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"File name too long"):
        check_writable_dir(key="output_dir", path=str(tmp_path / ("x" * 300)), fix="-")


def test_a_read_only_folder_is_refused(tmp_path):
    ro = tmp_path / "ro"
    with read_only_dir(ro) as locked:
        if not locked:
            pytest.skip("cannot make a folder read-only for root here (no chattr +i)")
        for path in (ro, ro / "deeper" / "still"):
            with pytest.raises(ValueError, match=r"train\.checkpoint_dir=.*cannot be made or written"):
                check_writable_dir(key="train.checkpoint_dir", path=str(path), fix="-")
    assert list(ro.iterdir()) == []


def test_a_bad_value_is_refused_before_hydra_makes_its_run_folder(tmp_path, monkeypatch):
    """check_overrides runs the run's config through to_run_config itself, so `trainlab train`
    refuses optim.lr=nan before Hydra's app makes outputs/<date>/<time> in the working folder."""
    monkeypatch.chdir(tmp_path)
    msg = _refused(["optim.lr=nan"])
    assert msg.startswith("optim.lr=nan is not a finite number"), msg
    assert list(tmp_path.iterdir()) == []
    check_overrides([*TINY, "output_dir=${hydra:runtime.output_dir}"])  # left to the app to resolve


def test_a_folder_another_rank_makes_at_the_same_time_passes_and_hydras_is_kept(tmp_path, monkeypatch):
    """torchrun starts every rank's check at once: a rank that finds the run folder made by
    another between its look and its mkdir goes on (it failed CI with 'File exists'), and a
    passed Hydra folder stays for the rank that may already be using it."""
    import os

    from trainlab.config.folders import check_writable_dir

    run_dir = tmp_path / "outputs" / "run"
    run_dir.mkdir(parents=True)  # the other rank's
    seen = os.path.lexists
    monkeypatch.setattr(os.path, "lexists", lambda p: False if str(p) == str(run_dir) else seen(p))
    check_writable_dir(key="hydra.run.dir", path=str(run_dir), fix="-", keep=True)
    assert run_dir.is_dir()
    monkeypatch.undo()
    fresh = tmp_path / "fresh" / "run"
    check_writable_dir(key="hydra.run.dir", path=str(fresh), fix="-", keep=True)
    assert fresh.is_dir()  # kept: Hydra makes it next anyway
    gone = tmp_path / "gone" / "run"
    check_writable_dir(key="output_dir", path=str(gone), fix="-")
    assert not (tmp_path / "gone").exists()  # not kept: a refused run leaves nothing behind
