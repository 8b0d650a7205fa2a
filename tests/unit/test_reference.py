"""config/reference.py: the configuration reference page is generated from the schema, and the
committed page is what the schema generates today."""

from __future__ import annotations

import dataclasses

from conftest import REPO
from trainlab.config import reference
from trainlab.config.schema import RunConfig

PAGE = REPO / "docs" / "pages" / "reference" / "configuration.md"


def _leaf_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        kind = reference.field_types(cls)[f.name]
        keys += _leaf_keys(kind, f"{prefix}{f.name}.") if dataclasses.is_dataclass(kind) else [prefix + f.name]
    return keys


def test_the_committed_page_is_what_the_schema_generates():
    assert PAGE.read_text() == reference.page(), (
        f"{PAGE.relative_to(REPO)} is out of date with config/schema.py; regenerate it: {reference.COMMAND}")


def test_every_field_has_a_row_with_its_meaning():
    rows = reference.rows()
    assert [r.key for r in rows] == _leaf_keys(RunConfig)
    undocumented = [r.key for r in rows if not r.meaning]
    assert not undocumented, f"fields without a docstring under them in the schema: {undocumented}"
    for r in rows:
        assert f"| `{r.key}` |" in PAGE.read_text(), r.key


def test_ranges_choices_and_defaults_come_from_the_schema():
    by_key = {r.key: r for r in reference.rows()}
    # a range from bounded(...), with its sentinel note and a sibling bound
    assert by_key["cluster.min_workers"].allowed.startswith(">= 0; <= num_workers; 0 = a fixed gang")
    assert by_key["precision.backoff_factor"].allowed == "> 0; < 1"
    # choices from the section's _one_of(...) checks, named constants and literal tuples alike
    assert "one of `ddp`, `zero1`" in by_key["parallel.name"].allowed
    assert by_key["precision.loss_scale"].allowed == "one of `dynamic`, `none`"
    # a text rule
    assert by_key["tracking.run_name"].allowed == "at most 200 bytes; one file or folder name"
    # defaults and types as the schema declares them
    assert (by_key["train.max_steps"].type, by_key["seed"].default) == ("int", "0")
    assert by_key["precision.keep_hp"].default == "null"
    assert by_key["model.smooth_swiglu"].default == "false"
    # the meaning is the attribute docstring, joined onto one line
    assert by_key["optim.grad_clip"].meaning == "Clip the global gradient norm to this; 0 = no clipping (norm still measured)."
