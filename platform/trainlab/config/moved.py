"""Settings that moved or lost a value: refused with what to write instead, and read back in
today's terms from what older trials recorded (a checkpoint's manifest, MLflow params).

A user who writes an old key (`train.inject_fault=sigkill@5:1`, on the command line or in a
YAML) gets one line naming the key, the value and the key to write; a checkpoint written before
the move still resumes, its recorded config fields read under their new keys.
"""

from __future__ import annotations

from typing import Any

MOVED_KEYS = {
    # test and benchmark instruments left the user's sections for `debug` (config.debug)
    "train.inject_nan": "debug.inject_nan",
    "train.inject_fault": "debug.inject_fault",
    "cluster.slowdown": "debug.slowdown",
    "cluster.logical_gpus": "debug.logical_gpus",
}
"""Old dotted key -> the key it is now."""

REMOVED_VALUES = {
    ("precision.fp8_impl", "auto"): "native",  # auto always ran native (or was refused as native is)
}
"""(key, value no longer accepted) -> the value that does what it did."""


def moved_key_message(key: str, value: Any) -> str | None:
    """The error for an old key (None if `key` did not move)."""
    new = MOVED_KEYS.get(key)
    if new is None:
        return None
    return (f"{key}={value} is not a setting any more: test and benchmark knobs moved to the debug "
            f"section; write {new}={value}")


def removed_value_message(key: str, value: Any) -> str | None:
    """The error for a value no longer accepted (None if `value` is fine)."""
    instead = REMOVED_VALUES.get((key, value)) if isinstance(value, str) else None
    if instead is None:
        return None
    return (f"{key}={value} is no longer an option: it always ran as {instead}; write {key}={instead} "
            f"(the default) or leave it out")


def moved_schema_message(missing: str, *, where: str) -> str | None:
    """The error for an option YAML whose defaults list names its schema as a group option
    (`- model_schema`, before the schemas left the groups: config.schema); None otherwise.
    `missing` is the config Hydra could not load (model/model_schema), `where` the YAML."""
    group, _, name = missing.rpartition("/")
    if not where.startswith(f"{group}/") or name != f"{group.rpartition('/')[2]}_schema":
        return None  # (`model=model_schema` on the command line is an unknown option: "In 'config'")
    return (f"{where}: its defaults list names the schema as '- {name}', a {group} option no more; "
            f"write '- /{name}@_here_' (the schema at the top of the config tree, merged here)")


def upgraded(fields: dict[str, Any]) -> dict[str, Any]:
    """Dotted config fields as an older trial recorded them, in today's keys and values."""
    out = {}
    for key, value in fields.items():
        key = MOVED_KEYS.get(key, key)
        out[key] = REMOVED_VALUES.get((key, value), value) if isinstance(value, str) else value
    return out
