"""The configuration reference, generated from the schema: every field of RunConfig as a row.

    python -m trainlab.config.reference > docs/pages/reference/configuration.md

For every field (dotted key): its type, its range (the ``bounded(...)``/``text(...)`` rule
declared next to it, config.bounds) or its choices (the option list its section's
``__post_init__`` holds it to with ``_one_of``), its default in the schema, and its meaning (the
attribute docstring under the field, read from the source with ``ast``, as the schema writes
them). Nothing here is written by hand: a schema change shows up in the page once it is
regenerated, and tests/unit/test_reference.py fails until it is.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import sys
from typing import Any

from trainlab.config.bounds import Bounds, TextRule, field_types, rule_of
from trainlab.config.schema import RunConfig

COMMAND = "python -m trainlab.config.reference > docs/pages/reference/configuration.md"
"""How the committed page is made (the test's failure message says it)."""


@dataclasses.dataclass(frozen=True)
class Row:
    key: str
    type: str
    allowed: str
    default: str
    meaning: str


@functools.cache
def _class_node(cls: type) -> tuple[ast.ClassDef, dict[str, Any]]:
    """The class's syntax tree and the globals of the module that defines it."""
    module = sys.modules[cls.__module__]
    tree = ast.parse(inspect.getsource(module))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return node, vars(module)
    raise LookupError(f"{cls.__name__} not found in {module.__name__}")  # pragma: no cover


def docstrings(cls: type) -> dict[str, str]:
    """Each field's attribute docstring: the string literal right after its annotated line."""
    body = _class_node(cls)[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def choices(cls: type) -> dict[str, tuple[str, ...]]:
    """The option lists `__post_init__` holds fields to: `_one_of(section, name, value, CHOICES)`."""
    node, namespace = _class_node(cls)
    found = {}
    for call in ast.walk(node):
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "_one_of"
                and len(call.args) == 4 and isinstance(call.args[1], ast.Constant)):
            arg = call.args[3]
            options = namespace[arg.id] if isinstance(arg, ast.Name) else ast.literal_eval(arg)
            found[call.args[1].value] = tuple(options)
    return found


def _type_name(kind: Any) -> str:
    if isinstance(kind, type):
        return kind.__name__
    return str(kind).replace("typing.", "").replace("NoneType", "None")


def _bound(value: Any) -> str:
    return value if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


def _allowed(cls: type, f: dataclasses.Field, options: dict[str, tuple[str, ...]]) -> str:
    if f.name in options:
        return "one of " + ", ".join(f"`{o}`" for o in options[f.name])
    rule = rule_of(f)
    parts = []
    if isinstance(rule, Bounds):
        for op, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            value = getattr(rule, op)
            if value is not None:
                parts.append(f"{sign} {_bound(value)}")
        parts += [rule.note] if rule.note else []
    elif isinstance(rule, TextRule):
        parts += ["not empty"] if rule.nonempty else []
        parts += [f"at most {rule.max_bytes} bytes"] if rule.max_bytes else []
        parts += ["one file or folder name"] if rule.file_name else []
    return "; ".join(parts)


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:  # pragma: no cover - every schema field has a default
        return ""
    if value == "???":
        return "(set by the group option)"
    if isinstance(value, bool) or value is None:
        return str(value).lower() if isinstance(value, bool) else "null"
    return repr(value) if isinstance(value, str) else _bound(value) if not isinstance(value, list) else str(value)


def rows(cls: type = RunConfig, prefix: str = "") -> list[Row]:
    """One Row per leaf field of `cls`, nested sections flattened to dotted keys, in schema order."""
    kinds, docs, options = field_types(cls), docstrings(cls), choices(cls)
    out = []
    for f in dataclasses.fields(cls):
        kind = kinds[f.name]
        if dataclasses.is_dataclass(kind):
            out += rows(kind, f"{prefix}{f.name}.")
            continue
        out.append(Row(f"{prefix}{f.name}", _type_name(kind), _allowed(cls, f, options), _default(f),
                       docs.get(f.name, "")))
    return out


def sections(cls: type = RunConfig) -> list[tuple[str, type]]:
    """The top-level sections (Hydra groups and debug) in schema order, then the root fields."""
    kinds = field_types(cls)
    return [(f.name, kinds[f.name]) for f in dataclasses.fields(cls) if dataclasses.is_dataclass(kinds[f.name])]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(rows_: list[Row]) -> list[str]:
    lines = ["| key | type | allowed | default | meaning |", "|---|---|---|---|---|"]
    lines += [f"| `{r.key}` | `{_cell(r.type)}` | {_cell(r.allowed)} | `{_cell(r.default)}` | {_cell(r.meaning)} |"
              for r in rows_]
    return lines


def page() -> str:
    """The whole reference page, Markdown."""
    out = [
        "# Configuration reference",
        "",
        "<!-- generated by `" + COMMAND + "`; do not edit -->",
        "",
        "Every field of the typed config (`config/schema.py`), as a dotted key you can override on",
        "the command line (`trainlab train train.max_steps=30`). *allowed* is the range or the",
        "choices the config layer holds the field to before anything starts; *default* is the",
        "schema's own, which a group option's YAML (`conf/<group>/<option>.yaml`) may change.",
        "",
    ]
    for name, cls in sections():
        doc = " ".join(inspect.cleandoc(cls.__doc__ or "").split())
        out += [f"## {name}", "", doc, "", *_table(rows(cls, f"{name}.")), ""]
    top = [r for r in rows() if "." not in r.key]
    out += ["## top level", "", *_table(top), ""]
    return "\n".join(out)


def main() -> None:
    sys.stdout.write(page())


if __name__ == "__main__":
    main()
