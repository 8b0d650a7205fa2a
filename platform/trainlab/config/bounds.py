"""One rule for every scalar setting, declared next to the field and checked in one place.

A schema field states its constraint where it is declared::

    lr: float = bounded(1e-3, gt=0)
    seed: int = bounded(0, ge=0, le=2**32 - 1, why="numpy's global seed is 32-bit")
    run_name: str = text("", max_bytes=200, file_name=True)

and :func:`check_fields` (run first in every section's ``__post_init__``, and over the whole
tree by ``check_run``) holds every field to its type and its rule before anything starts:

- int: an integer (not a bool) that a worker's int64 (torch, numpy) can hold, inside its bounds;
- float: a finite number (no nan, no inf) inside its bounds;
- str: text that encodes as UTF-8, with no control or bidirectional-override characters, and
  the field's own shape (not empty, at most so many bytes, usable as one file name);
- list[...]: each element by the element type's rule and the field's bounds.

A failure is a ValueError naming the field, the value and what to write instead.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import typing
from dataclasses import dataclass, field
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_KEY = "trainlab.rule"
# bidirectional embeddings, overrides and isolates: text that displays other than it reads
_BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}
_SHOWN_CHARS = 40


@dataclass(frozen=True)
class Bounds:
    """A numeric field's range (each bound optional) and the words that explain it."""

    gt: float | str | None = None
    ge: float | str | None = None
    lt: float | str | None = None
    le: float | str | None = None
    """A bound given as a string names a sibling field whose value it is (le="num_workers")."""
    note: str = ""
    """What a sentinel inside the range means, e.g. '0 = derive'."""
    why: str = ""
    """Why the range is what it is, when that is not obvious."""


@dataclass(frozen=True)
class TextRule:
    """A string field's shape beyond the rule every string keeps."""

    nonempty: bool = False
    max_bytes: int | None = None
    """Longest UTF-8 encoding allowed."""
    file_name: bool = False
    """The value names one folder or file: no '/' or '\\', not '.' or '..'."""
    why: str = ""


def bounded(default: Any = dataclasses.MISSING, *, gt: float | str | None = None,
            ge: float | str | None = None, lt: float | str | None = None, le: float | str | None = None,
            note: str = "", why: str = "",
            default_factory: Any = dataclasses.MISSING) -> Any:
    """A numeric field (or list of numbers, with default_factory) with its range."""
    rule = Bounds(gt=gt, ge=ge, lt=lt, le=le, note=note, why=why)
    return field(default=default, default_factory=default_factory, metadata={_KEY: rule})


def text(default: str = "", *, nonempty: bool = False, max_bytes: int | None = None,
         file_name: bool = False, why: str = "") -> Any:
    """A string field with its shape."""
    rule = TextRule(nonempty=nonempty, max_bytes=max_bytes, file_name=file_name, why=why)
    return field(default=default, metadata={_KEY: rule})


def rule_of(f: dataclasses.Field) -> Bounds | TextRule | None:
    return f.metadata.get(_KEY)


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """The resolved annotations of a dataclass (the schema uses postponed annotations)."""
    return typing.get_type_hints(cls)


# ---------------------------------------------------------------------------------------
def check_fields(obj: Any, *, section: str = "", recurse: bool = True) -> None:
    """Every field of the dataclass `obj` (and, with recurse, of its nested sections) against
    its type and declared rule; ValueError naming the first bad field, its value and the fix."""
    types = field_types(type(obj))
    prefix = f"{section}." if section else ""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            if recurse:
                check_fields(value, section=prefix + f.name)
            continue
        rule = rule_of(f)
        if isinstance(rule, Bounds):  # a bound naming a sibling field takes its value
            rule = dataclasses.replace(rule, **{
                b: _Sibling(getattr(obj, getattr(rule, b)), prefix + getattr(rule, b))
                for b in ("gt", "ge", "lt", "le") if isinstance(getattr(rule, b), str)})
        check_value(prefix + f.name, value, kind=types[f.name], rule=rule, default=_default(f))


@dataclass(frozen=True)
class _Sibling:
    """A bound that is another field's value, shown as that field: 'cluster.num_workers=2'."""

    value: float
    key: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}"


def _value(bound: Any) -> Any:
    """A bound as a number; None for one not resolved (a sibling's name outside check_fields)."""
    return bound.value if isinstance(bound, _Sibling) else None if isinstance(bound, str) else bound


def check_value(key: str, value: Any, *, kind: Any, rule: Bounds | TextRule | None = None,
                default: Any = None) -> None:
    """One value against its declared type (int, float, bool, str, a list or Optional of them)
    and rule."""
    args = typing.get_args(kind)
    if type(None) in args:  # Optional[X]: None is a legal value
        if value is None:
            return
        kind = next(a for a in args if a is not type(None))
    origin = typing.get_origin(kind)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key}={value!r} is not a list; write it as {key}=[...]")
        (item,) = typing.get_args(kind)[:1] or (Any,)
        for v in value:
            _check_scalar(key, v, kind=item, rule=rule, default=None, whole=list(value))
        return
    _check_scalar(key, value, kind=kind, rule=rule, default=default, whole=None)


def _check_scalar(key: str, value: Any, *, kind: Any, rule: Any, default: Any, whole: list | None) -> None:
    where = f"{key}={shown(whole)} holds {shown(value)}, which" if whole is not None else f"{key}={shown(value)}"
    target = f"each element of {key}" if whole is not None else key
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where} is not true or false; set {key}=true or {key}=false")
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where} is not an integer; {_fix(target, rule, 'an integer', default)}")
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError(f"{where} does not fit a 64-bit integer (the workers' torch and numpy hold "
                             f"at most {INT64_MAX}); {_fix(target, rule, 'an integer', default)}")
        _check_range(where, target, value, rule, "an integer", default)
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where} is not a number; {_fix(target, rule, 'a number', default)}")
        if not math.isfinite(value):
            raise ValueError(f"{where} is not a finite number; {_fix(target, rule, 'a finite number', default)}")
        _check_range(where, target, value, rule, "a number", default)
    elif kind is str:
        if not isinstance(value, str):
            raise ValueError(f"{where} is not text; quote it: {key}='...'")
        _check_text(where, key, value, rule if isinstance(rule, TextRule) else TextRule(), default)


def _check_range(where: str, key: str, value: float, rule: Any, noun: str, default: Any) -> None:
    if not isinstance(rule, Bounds):
        return
    gt, ge, lt, le = (_value(b) for b in (rule.gt, rule.ge, rule.lt, rule.le))
    inside = ((gt is None or value > gt) and (ge is None or value >= ge)
              and (lt is None or value < lt) and (le is None or value <= le))
    if not inside:
        raise ValueError(f"{where} is out of range; {_fix(key, rule, noun, default)}")


def _check_text(where: str, key: str, value: str, rule: TextRule, default: Any) -> None:
    example = f", e.g. {key}={default}" if default else ""
    why = f" ({rule.why})" if rule.why else ""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise ValueError(f"{where} is not valid UTF-8 text (undecodable byte at position {e.start}, "
                         f"as a shell passes bytes of another encoding); write it in UTF-8") from None
    bad = next((i for i, c in enumerate(value) if (c < " " or c == "\x7f") or c in _BIDI), None)
    if bad is not None:
        what = "a bidirectional-override" if value[bad] in _BIDI else "a control"
        raise ValueError(f"{where} holds {what} character ({value[bad]!r} at position {bad}); "
                         f"remove it{example}")
    if rule.nonempty and not value.strip():
        raise ValueError(f"{where} is empty; give it a name{why}{example}")
    if rule.max_bytes is not None and size > rule.max_bytes:
        raise ValueError(f"{where} is {size} bytes long, more than the {rule.max_bytes} allowed{why}; "
                         f"shorten it to {rule.max_bytes} bytes at most")
    if rule.file_name and ("/" in value or "\\" in value or value in (".", "..")):
        sep = "/" if "/" in value else "\\" if "\\" in value else value
        fixed = "-".join(p for p in re.split(r"[/\\]+", value) if p not in ("", ".", "..")) or "run"
        raise ValueError(f"{where} holds {sep!r}, but {rule.why or 'it names one folder'}; write it "
                         f"without (e.g. {key}={fixed})")


def _fix(key: str, rule: Any, noun: str, default: Any) -> str:
    """'set KEY to NOUN RANGE (why) (note), e.g. KEY=DEFAULT (its default)'."""
    what = noun
    if isinstance(rule, Bounds):
        low = f"({_num(rule.gt)}" if rule.gt is not None else f"[{_num(rule.ge)}" if rule.ge is not None else ""
        high = f"{_num(rule.lt)})" if rule.lt is not None else f"{_num(rule.le)}]" if rule.le is not None else ""
        if rule.gt == 0:  # 'a positive integer (above 0)', 'a positive number in (0, 1]'
            noun = noun.replace("an ", "a ").replace("a ", "a positive ", 1)
        if low and high:
            what = f"{noun} in {low}, {high}"
        elif low:
            what = f"{noun} (above 0)" if rule.gt == 0 else f"{noun} {'>' if low[0] == '(' else '>='} {low[1:]}"
        elif high:
            what = f"{noun} {'<' if high[-1] == ')' else '<='} {high[:-1]}"
        what += "".join(f" ({s})" for s in (rule.why, rule.note) if s)
    example = f", e.g. {key}={_num(default)} (its default)" if isinstance(default, (int, float)) else ""
    return f"set {key} to {what}{example}"


def _num(x: Any) -> str:
    if isinstance(x, float) and x.is_integer():
        if abs(x) >= 1e16 and math.log2(abs(x)).is_integer():
            return f"{'-' * (x < 0)}2**{int(math.log2(abs(x)))}"
        return str(int(x)) if abs(x) >= 1e4 else repr(x)
    return repr(x) if isinstance(x, float) else str(x)


def shown(value: Any) -> str:
    """A value as a message shows it: repr, long text cut to its first characters."""
    if isinstance(value, str) and len(value) > _SHOWN_CHARS:
        return f"{value[:_SHOWN_CHARS]!r}... ({len(value)} characters)"
    return repr(value)


def _default(f: dataclasses.Field) -> Any:
    d = f.default
    return None if d is dataclasses.MISSING or d == "???" or isinstance(d, bool) else d
