"""The per-step stop vote carries why across a gang (2 gloo ranks): only rank 0 polls the
driver's flag, so a `prune` it heard must stop rank 1 too, as `prune`; a rank that got a
preemption makes every rank stop as `preempt` (with a checkpoint), whatever the others heard."""

from __future__ import annotations

import pytest

from conftest import rank_env, spawn_ranks

pytestmark = pytest.mark.distributed

CASES = (  # what (rank 0, rank 1) were asked from outside -> what every rank's vote says
    (("", ""), ""),
    (("prune", ""), "prune"),
    (("", "prune"), "prune"),
    (("prune", "preempt"), "preempt"),
    (("preempt", "prune"), "preempt"),
)


def _vote(rank: int, world: int, port: int, out) -> None:
    rank_env(rank, world, port)
    import torch.distributed as dist

    from trainlab.engine import preemption

    dist.init_process_group("gloo")
    try:
        seen = []
        for asked, _ in CASES:
            preemption.listen_outside()  # clears the last case's request, as a new trial's does
            vote = preemption.Preemption()
            if asked[rank]:
                preemption.stop_from_outside(asked[rank])
            seen.append(vote.requested())
            vote.close()
        out.put((rank, seen))
    finally:
        dist.destroy_process_group()


def test_every_rank_stops_for_the_strongest_reason_any_rank_heard():
    got = dict(spawn_ranks(_vote, 2, results=2, timeout=120))
    expected = [want for _, want in CASES]
    assert got[0] == expected and got[1] == expected
