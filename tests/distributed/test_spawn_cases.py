"""tests/spawn_cases.py, the helper that runs several cases in one spawned group: each case's
result comes back under its name; a case that fails on rank 1 only is reported with rank 1's
error and named, and the cases after it still run (in a fresh group) and pass."""

from __future__ import annotations

import os

import pytest

from spawn_cases import spawn_cases

pytestmark = pytest.mark.distributed


def _case(rank: int, world: int, args: tuple[str, int]) -> tuple[int, int, int]:
    """(the rank's pid, the world, the sum over ranks of rank+1), or raise on rank `fail_on`."""
    import torch
    import torch.distributed as dist

    kind, fail_on = args
    if kind == "fail" and rank == fail_on:
        raise ValueError(f"case failed on rank {rank}")
    total = torch.tensor([rank + 1])
    dist.all_reduce(total)  # a peer that failed leaves this rank here until the group is killed
    return os.getpid(), dist.get_world_size(), int(total)


@pytest.mark.slow  # the harness's own check, with a failing rank
def test_each_case_reports_under_its_name_and_a_failure_names_its_case_and_rank():
    got = spawn_cases(_case, 2, {"a": ("ok", -1), "b": ("ok", -1), "bad": ("fail", 1), "c": ("ok", -1)},
                      timeout=120)
    assert list(got) == ["a", "b", "bad", "c"]
    assert [got[k].result()[1:] for k in ("a", "b", "c")] == [(2, 3)] * 3
    assert got["a"].result()[0] == got["b"].result()[0], "a and b ran in one group"
    assert got["c"].result()[0] != got["a"].result()[0], "the case after the failure ran in a fresh group"
    assert 1 in got["bad"].errors and "ValueError: case failed on rank 1" in got["bad"].errors[1], got["bad"].errors
    with pytest.raises(pytest.fail.Exception, match=r"case 'bad' failed on rank\(s\) \[.*1\]"):
        got["bad"].result()
