"""What to write instead: overrides Hydra cannot read, and group options that leave conf/.

Hydra reports an argument it cannot parse with its lexer's words and a caret
(`LexerNoViableAltException: --max_steps=5 ^`); the forms people actually type instead of
key=value (a flag, YAML's `key: value`, a value the shell cut at a space, a bare group name)
are recognised here and answered with the override to write. A group option is a file name
under conf/<group>/ (sweeps/<group>/ for `+sweep=`): one that climbs out with `..` or starts
at `/` would compose a YAML from anywhere on the machine, so it is refused with the options.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import PurePath
from typing import Any, Sequence

from trainlab.config.bounds import check_value
from trainlab.config.convert import CONF_DIR, SWEEPS_DIR, group_options, schema_at
from trainlab.config.schema import GROUPS, RunConfig

_KEY_VALUE = "write each override as key=value (e.g. model=tiny train.max_steps=50)"


def unreadable_override_message(args: Sequence[str]) -> str | None:
    """The first argument Hydra's override grammar refuses, and what to write instead; None if
    every argument parses on its own."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for i, arg in enumerate(args):
        try:
            parser.parse_override(arg)
        except HydraException as e:
            reason = str(e).splitlines()[0]
            return _instead(arg, previous=args[i - 1] if i else None, reason=reason)
    return None


def _instead(arg: str, *, previous: str | None, reason: str) -> str:
    text = arg.strip()
    if text.startswith("-"):  # --max_steps=5, -seed 3: a flag where Hydra takes key=value
        name, sep, value = text.lstrip("-").partition("=")
        return (f"{arg!r} is a flag; settings are given to trainlab train as key=value, without "
                f"dashes: write {_written(name, value if sep else 'VALUE')}")
    colon, equal = text.find(":"), text.find("=")
    if colon > 0 and (equal < 0 or colon < equal):  # 'model: small': YAML, not an override
        name, _, value = text.partition(":")
        return (f"{arg!r} is YAML's key: value; an override is key=value: write "
                f"{_written(name, value.strip() or 'VALUE')}")
    if equal < 0:
        if text in GROUPS:
            return (f"{arg!r} is not an override (key=value); choose a {text} option: {text}=OPTION, "
                    f"one of {', '.join(group_options(text))}")
        keys = known_keys(text)
        if keys:
            return f"{arg!r} is not an override (key=value); give it a value: {' or '.join(k + '=VALUE' for k in keys)}"
        if previous is not None and "=" in previous and not previous.startswith("-"):
            key, _, value = previous.partition("=")
            whole = f"{key}={value} {arg}"
            return (f"{arg!r} is not an override (key=value); if it is the rest of {key}'s value, cut "
                    f"at a space by the shell, quote the whole override: '{whole}' (Hydra keeps a "
                    f"space inside one argument; {key}=\"'{value} {arg}'\" works too)")
        return f"{arg!r} is not an override (key=value); {_KEY_VALUE}"
    key, _, value = text.partition("=")
    try:  # a control character or undecodable byte: no quoting makes it a good value
        check_value(key, value, kind=str)
    except ValueError as e:
        return str(e)
    if not value.isascii():
        return (f"{key}={value!r}: Hydra reads text other than ASCII only inside quotes; quote the "
                f"value (the shell passes the inner quotes on): \"{key}='{value}'\"")
    called = re.search(r"while evaluating '(\w+)\(.*?': (.*)", reason)
    if called and called.group(1) in _SWEEP_FORMS:  # a sweep with wrong arguments: quoting would make it a string
        name, why = called.groups()
        return f"{key}={value}: {name}(...): {why.rstrip('.')}; {_SWEEP_FORMS[name].format(key=key, **_examples(key))}"
    return (f"{arg!r} cannot be read as an override ({reason}); if {key}'s value holds characters "
            f"Hydra's grammar reserves (= , [ ] {{ }} ( ) quotes, or spaces at its ends), quote it: "
            f"\"{key}='{value}'\"")


_SWEEP_FORMS = {
    "interval": "interval(low,high) takes two numbers, low <= high, e.g. {key}=interval({low},{high})",
    "range": "range(start,stop[,step]) takes numbers, e.g. {key}=range({start},{stop})",
    "choice": "choice(...) takes one value or more, e.g. {key}=choice({one})",
}
"""Hydra's sweep functions whose arguments a user gets wrong, and what each takes."""


def _examples(key: str) -> dict[str, str]:
    """Values of `key`'s kind for a sweep's example, from its default (a number: a tenth to ten
    times it; a count: it to twice it): the sweep the message writes composes."""
    default = default_of(key)
    number = isinstance(default, (int, float)) and not isinstance(default, bool) and default > 0
    low, high = (f"{default / 10:g}", f"{default * 10:g}") if number else ("1e-4", "1e-2")
    start, stop = (default, 2 * default) if isinstance(default, int) and number else (0, 4)
    one = ",".join(group_options(key)[:2]) if key in GROUPS else "VALUE" if default in (None, "") else str(default)
    return {"low": low, "high": high, "start": str(start), "stop": str(stop), "one": one}


def default_of(key: str) -> Any:
    """The schema's default of dotted `key`; None where it has none (or no such field)."""
    section, _, name = key.rpartition(".")
    schema = schema_at(section) if section else RunConfig
    fields = {f.name: f for f in dataclasses.fields(schema)} if schema else {}
    f = fields.get(name)
    if f is None or f.default is dataclasses.MISSING or f.default == "???":
        return None
    return f.default


def _written(name: str, value: str) -> str:
    """key=value for a name written as a flag or YAML key: its full dotted key where the
    schema has exactly one (max_steps -> train.max_steps)."""
    keys = known_keys(name.strip()) or [name.strip().replace("-", "_")]
    return " or ".join(f"{k}={value}" for k in keys)


def known_keys(name: str) -> list[str]:
    """The dotted keys (or group names) a bare or dotted `name` refers to in the schema."""
    name = name.replace("-", "_")
    if name in GROUPS:
        return [name]
    section, _, field = name.rpartition(".")
    schema = schema_at(section)
    if schema is not None and field in {f.name for f in dataclasses.fields(schema)}:
        return [name]
    if section:
        return []
    top = [f.name for f in dataclasses.fields(RunConfig) if f.name == name]
    if top:
        return top
    return [f"{g}.{name}" for g in (*GROUPS, "debug")  # debug: a section, not a group of options
            if name in {f.name for f in dataclasses.fields(schema_at(g))}]


# ---------------------------------------------------------------------------------------
def check_group_options(parsed: Sequence[Any]) -> None:
    """ValueError for a group option (or any of a sweep's) that leaves its group's folder."""
    for o in parsed:
        if o.is_delete():
            continue
        group = o.key_or_group
        if not _is_group(group):
            continue
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
        for value in values:
            if isinstance(value, str) and _leaves_folder(value):
                folder = f"sweeps/{group}" if group not in GROUPS and (SWEEPS_DIR / group).is_dir() \
                    else f"conf/{group}"
                options = group_options(group)
                choose = f"; choose one of {', '.join(options)}" if options else ""
                raise ValueError(
                    f"{group}={value} is not an option of {group}: options are the files in {folder}/, "
                    f"named without a path ('..' or a leading '/' would compose a YAML from outside "
                    f"the project){choose}")


def _is_group(key: str) -> bool:
    return (key in GROUPS or key.startswith("hydra/") or (CONF_DIR / key).is_dir()
            or (SWEEPS_DIR / key).is_dir())


def _leaves_folder(option: str) -> bool:
    path = PurePath(option)
    return (os.path.isabs(option) or option.startswith(("~", "\\")) or ".." in path.parts
            or "\\" in option or "\x00" in option)
