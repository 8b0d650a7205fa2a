"""The one rule for scalar settings (trainlab.config.bounds): every numeric field of the schema
declares its range next to it, one checker holds every field to its type and range (finite,
inside int64, in range; text in UTF-8 without control characters, in its shape), and a refusal
names the field, the value and what to write instead."""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass

import pytest

from trainlab.config import ConfigError, RunConfig, compose_run_config
from trainlab.config.bounds import (
    INT64_MAX,
    Bounds,
    bounded,
    check_fields,
    check_value,
    field_types,
    rule_of,
    text,
)
from trainlab.config.validate import check_run

TINY = ["model=tiny", "train.max_steps=3"]


def _sections(cls: type = RunConfig, prefix: str = ""):
    """(section class, dotted section name) for RunConfig and every section nested in it."""
    yield cls, prefix.rstrip(".")
    for f in dataclasses.fields(cls):
        if isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory):
            yield from _sections(f.default_factory, f"{prefix}{f.name}.")


def _numeric(kind) -> bool:
    args = typing.get_args(kind)
    return kind in (int, float) or (typing.get_origin(kind) is list and args[0] in (int, float))


NUMERIC_FIELDS = [(cls, section, f) for cls, section in _sections() for f in dataclasses.fields(cls)
                  if _numeric(field_types(cls)[f.name])]


def test_every_numeric_field_states_its_range_in_the_schema():
    assert len(NUMERIC_FIELDS) > 60  # the schema's ints, floats and lists of numbers
    undeclared = [f"{s}.{f.name}".lstrip(".") for _, s, f in NUMERIC_FIELDS if not isinstance(rule_of(f), Bounds)]
    assert not undeclared, f"numeric fields without a declared range: {undeclared}"


def test_every_default_keeps_its_own_rule():
    check_fields(RunConfig())  # nothing raised
    check_run(compose_run_config(TINY))


def _outside(bound: float, *, above: bool, integer: bool) -> float:
    """The nearest value past `bound` on the wrong side."""
    if integer:
        return int(bound) + (1 if above else -1)
    return math.nextafter(bound, math.inf if above else -math.inf)


def _cases_past_every_bound():
    for cls, section, f in NUMERIC_FIELDS:
        rule, kind = rule_of(f), field_types(cls)[f.name]
        integer = kind is int or typing.get_args(kind)[:1] == (int,)
        listed = typing.get_origin(kind) is list
        for name in ("gt", "ge", "lt", "le"):
            bound = getattr(rule, name)
            if bound is None or isinstance(bound, str):
                continue
            # gt and lt are themselves outside; ge and le the next value past them
            value = bound if name in ("gt", "lt") else _outside(bound, above=name == "le", integer=integer)
            value = int(value) if integer else float(value)
            yield pytest.param(cls, section, f.name, [value] if listed else value,
                               id=f"{section}.{f.name}-{name}".lstrip("."))


@pytest.mark.parametrize(("cls", "section", "name", "value"), list(_cases_past_every_bound()))
def test_a_value_just_past_each_declared_bound_is_refused_by_the_section(cls, section, name, value):
    key = f"{section}.{name}".lstrip(".")
    with pytest.raises(ValueError) as info:
        cls(**{name: value})
    msg = str(info.value)
    assert msg.startswith(f"{key}="), msg
    assert f"set {key if not isinstance(value, list) else 'each element of ' + key} to" in msg, msg


@pytest.mark.parametrize(("override", "says"), [
    ("optim.lr=nan", ["optim.lr=nan", "not a finite number", "set optim.lr to a positive finite number"]),
    ("optim.lr=inf", ["optim.lr=inf", "not a finite number", "optim.lr=0.001"]),
    ("optim.lr=-inf", ["optim.lr=-inf", "not a finite number"]),
    ("optim.lr=1e400", ["optim.lr=inf"]),  # what YAML makes of it
    ("seed=-1", ["seed=-1", "[0, 4294967295]", "32-bit", "seed=0"]),
    ("seed=4294967296", ["seed=4294967296", "[0, 4294967295]"]),
    ("seed=99999999999999999999", ["seed=99999999999999999999", "64-bit", "[0, 4294967295]"]),
    ("optim.grad_clip=nan", ["optim.grad_clip=nan", "a finite number >= 0", "0 = no clipping"]),
    ("model.norm_eps=-1", ["model.norm_eps=-1.0", "positive", "model.norm_eps=1e-05"]),
    ("model.rope_theta=0", ["model.rope_theta=0.0", "a number > 1", "model.rope_theta=10000"]),
    ("train.max_steps=9223372036854775808", ["train.max_steps=9223372036854775808", "64-bit",
                                             "9223372036854775807", "train.max_steps=200"]),
    ("cluster.start_timeout_s=inf", ["cluster.start_timeout_s=inf", "(0, 86400]", "cluster.start_timeout_s=10.0"]),
    ("cluster.start_timeout_s=1e10", ["cluster.start_timeout_s=10000000000.0", "(0, 86400]"]),
    ("tracking.experiment=''", ["tracking.experiment=''", "empty", "tracking.experiment=trainlab"]),
    ("tracking.run_name=" + "r" * 300, ["tracking.run_name='rrrr", "300 bytes", "200"]),
    ("tracking.run_name='" + "é" * 150 + "'", ["300 bytes", "200"]),  # 150 characters, 2 bytes each
    ("tracking.run_name=a/b", ["tracking.run_name='a/b'", "'/'", "tracking.run_name=a-b"]),
    ("precision.init_scale=1e39", ["precision.init_scale=1e+39", "2**127", "fp32"]),
    ("cluster.min_workers=3", ["cluster.min_workers=3", "[0, cluster.num_workers=2]"]),
    ("debug.slowdown=[1,nan]", ["debug.slowdown=[1.0, nan]", "holds nan", "each element of debug.slowdown"]),
])
def test_named_values_are_refused_with_field_value_and_fix(override, says):
    with pytest.raises(ConfigError) as info:
        compose_run_config([*TINY, override])
    msg = str(info.value)
    assert "\n" not in msg
    for part in says:
        assert part in msg, msg


def test_a_section_built_in_code_keeps_the_rule_and_check_run_sees_later_edits():
    from trainlab.config.schema import OptimConfig

    with pytest.raises(ValueError, match=r"optim\.lr=nan is not a finite number"):
        OptimConfig(lr=float("nan"))
    run = compose_run_config(TINY)
    run.train.max_steps = 2**63  # edited after it was validated, as a script might
    with pytest.raises(ValueError, match=r"train\.max_steps=9223372036854775808 does not fit a 64-bit integer"):
        check_run(run)


# ---------------------------------------------------------------------------------------
@dataclass
class _Example:
    count: int = bounded(1, gt=0)
    share: float = bounded(0.5, ge=0, lt=1)
    limit: int = bounded(4, ge=1)
    below: int = bounded(2, ge=0, le="limit")
    weights: list[float] = bounded(default_factory=list, gt=0)
    maybe: float | None = bounded(None, gt=0)
    flag: bool = False
    name: str = text("x", nonempty=True, max_bytes=8, file_name=True, why="it names a folder")
    note: str = ""

    def __post_init__(self) -> None:
        check_fields(self, section="ex")


@pytest.mark.parametrize(("changes", "says"), [
    ({"count": True}, "ex.count=True is not an integer"),
    ({"count": 2.0}, "ex.count=2.0 is not an integer"),
    ({"count": INT64_MAX + 1}, "does not fit a 64-bit integer"),
    ({"count": 0}, "ex.count=0 is out of range; set ex.count to a positive integer (above 0), e.g. ex.count=1"),
    ({"share": "0.5"}, "ex.share='0.5' is not a number"),
    ({"share": float("nan")}, "ex.share=nan is not a finite number; set ex.share to a finite number in [0, 1)"),
    ({"share": 1.0}, "ex.share=1.0 is out of range"),
    ({"share": -0.001}, "ex.share=-0.001 is out of range"),
    ({"below": 5}, "set ex.below to an integer in [0, ex.limit=4]"),
    ({"weights": [1.0, 0.0]}, "ex.weights=[1.0, 0.0] holds 0.0, which is out of range; set each element of ex.weights"),
    ({"weights": [math.inf]}, "holds inf, which is not a finite number"),
    ({"weights": 3.0}, "ex.weights=3.0 is not a list"),
    ({"maybe": -1.0}, "ex.maybe=-1.0 is out of range"),
    ({"flag": 1}, "ex.flag=1 is not true or false"),
    ({"name": ""}, "ex.name='' is empty"),
    ({"name": "  "}, "ex.name='  ' is empty"),
    ({"name": "ééééé"}, "ex.name='ééééé' is 10 bytes long, more than the 8 allowed (it names a folder)"),
    ({"name": ".."}, "ex.name='..' holds '..', but it names a folder"),
    ({"name": "a\\b"}, "holds '\\\\', but it names a folder; write it without (e.g. ex.name=a-b)"),
    ({"name": 5}, "ex.name=5 is not text"),
    ({"note": "a\x00b"}, "ex.note='a\\x00b' holds a control character ('\\x00' at position 1); remove it"),
    ({"note": "a\x7f"}, "holds a control character ('\\x7f' at position 1)"),
    ({"note": "\u202etxt.exe"}, "holds a bidirectional-override character ('\\u202e' at position 0)"),
    ({"note": "ok\udcff"}, "is not valid UTF-8 text (undecodable byte at position 2"),
])
def test_the_checker_holds_each_kind_of_field_to_its_rule(changes, says):
    with pytest.raises(ValueError) as info:
        _Example(**changes)
    assert says in str(info.value), str(info.value)


@pytest.mark.parametrize("changes", [
    {}, {"count": INT64_MAX}, {"share": 0.0}, {"below": 4}, {"below": 0}, {"weights": [0.5, 2.0]},
    {"maybe": None}, {"maybe": 1e-300}, {"name": "éééé"}, {"name": "run.1"}, {"note": "ünïcödé ok"},
])
def test_values_inside_the_rule_pass(changes):
    _Example(**changes)


def test_check_value_alone_takes_optional_and_list_types():
    check_value("k", None, kind=typing.Optional[int])
    check_value("k", [1, 2], kind=list[int], rule=Bounds(gt=0))
    with pytest.raises(ValueError, match=r"k=\[1, -2\] holds -2"):
        check_value("k", [1, -2], kind=list[int], rule=Bounds(gt=0))
