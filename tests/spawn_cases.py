"""Several cases in one spawned group of ranks, each case's result kept apart.

Spawning `world` fresh processes costs seconds each on a 2-core machine (interpreter, torch,
trainlab, the gloo rendezvous), often more than a tiny case itself. `spawn_cases` spawns one
group per call and runs the cases in it one after another, as a warm gang's workers run trials
(engine.isolation.GangState puts back between cases what a case changed in a process), and
returns each case's outcome by name, so that a test per case asserts on its own and pytest
names the case that failed.

A case that fails on any rank ends its group: the ranks that got past it may wait in a
collective for one that raised. Every rank's report of that case is kept (a failure of rank 1
is not hidden behind rank 0's), the group is killed, and the cases after it run in a fresh
group: one bad case costs one respawn, not the results of the others.
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest

from conftest import finish_reporting, free_port, rank_env
from trainlab.plan.here import plan_here

GRACE_S = 30
"""After a rank reported a case failed: how long the others get to report theirs (they may be
waiting on the failed rank in a collective until gloo notices it is gone)."""


@dataclass
class CaseOutcome:
    """What every rank of the group said about one case."""

    name: str
    value: Any = None
    """Rank 0's return value of the case (None until it finished)."""
    errors: dict[int, str] = field(default_factory=dict)
    """Rank -> the traceback it reported, or why nothing came from it."""

    def result(self) -> Any:
        """Rank 0's value; fails the calling test with every rank's error if the case failed."""
        if self.errors:
            shown = "\n".join(f"--- rank {r}\n{e[-3000:]}" for r, e in sorted(self.errors.items()))
            pytest.fail(f"case {self.name!r} failed on rank(s) {sorted(self.errors)}:\n{shown}", pytrace=False)
        return self.value


def spawn_cases(run_case: Callable[[int, int, Any], Any], world: int, cases: dict[str, Any], *,
                timeout: float = 300) -> dict[str, CaseOutcome]:
    """Run ``run_case(rank, world, args)`` for every ``name: args`` of `cases`, in order, in
    groups of `world` spawned ranks (one group unless a case fails); `run_case` must be a
    module-level function (spawn pickles it by name). Returns each case's outcome by name.
    `timeout`: seconds one case may take."""
    outcomes: dict[str, CaseOutcome] = {}
    pending = list(cases.items())
    while pending:
        outcomes.update(_one_group(run_case, world, pending, timeout=timeout))
        pending = [(n, a) for n, a in pending if n not in outcomes]
    return outcomes


def _one_group(run_case, world: int, cases: list[tuple[str, Any]], *, timeout: float) -> dict[str, CaseOutcome]:
    """Spawn a group for `cases` and collect outcomes until all are done or one failed (the
    failed one included; the rest are left for a fresh group)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    # the group's working directory: a trial without output_dir keeps ./checkpoints/<config hash>
    workdir = tempfile.mkdtemp(prefix="spawn-cases-")
    procs = [ctx.Process(target=_rank_main, args=(rank, world, port, out, run_case, cases, workdir))
             for rank in range(world)]
    for p in procs:
        p.start()
    done: dict[str, CaseOutcome] = {}
    reports: dict[str, dict[int, tuple[bool, Any]]] = {name: {} for name, _ in cases}
    try:
        for name, _ in cases:
            outcome = _collect(name, reports, out, procs, timeout=timeout)
            done[name] = outcome
            if outcome.errors:
                return done  # the group is killed below; the cases after this one get a fresh group
    finally:
        for p in procs:
            p.join(timeout=60 if len(done) == len(cases) and not any(o.errors for o in done.values()) else 0)
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(workdir, ignore_errors=True)
    codes = [p.exitcode for p in procs]
    if codes != [0] * world:  # every case passed (else returned above), then a rank failed on its way out
        for o in done.values():
            o.errors.update({r: f"exited with code {c} after the group's cases" for r, c in enumerate(codes) if c})
    return done


def _collect(name: str, reports: dict, out, procs, *, timeout: float) -> CaseOutcome:
    """Read the queue until every rank reported case `name`, one reported it failed (then the
    others get GRACE_S to report theirs), a rank died, or `timeout` passed."""
    world = len(procs)
    deadline = time.monotonic() + timeout
    got = reports[name]
    while len(got) < world:
        if any(not ok for ok, _ in got.values()):
            deadline = min(deadline, time.monotonic() + GRACE_S)
        try:
            case, rank, ok, payload = out.get(timeout=1)
            reports[case][rank] = (ok, payload)
            continue
        except queue.Empty:
            pass
        dead = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in got}
        if dead or time.monotonic() > deadline:
            why = {r: f"exited with code {c} before reporting this case" for r, c in dead.items()}
            late = {r: f"reported nothing within {timeout:.0f} s (or {GRACE_S} s after a peer failed)"
                    for r in range(world) if r not in got and r not in dead}
            errors = {r: str(p) for r, (ok, p) in got.items() if not ok}
            return CaseOutcome(name, errors={**errors, **why, **(late if not dead else {})})
    errors = {r: str(p) for r, (ok, p) in got.items() if not ok}
    return CaseOutcome(name, value=None if errors else got[0][1], errors=errors)


def _rank_main(rank: int, world: int, port: int, out, run_case, cases: list[tuple[str, Any]], workdir: str) -> None:
    """One spawned rank: the world group (as a warm gang's worker has it), then each case, with
    the process put back as it was after each (GangState.after_trial); every case's result or
    traceback onto `out` as (case, rank, ok, payload). Ends at the first case that raised."""
    rank_env(rank, world, port)
    os.chdir(workdir)
    import torch.distributed as dist

    from trainlab.distributed import close_distributed
    from trainlab.engine.isolation import GangState

    if world > 1:
        dist.init_process_group("gloo")
    state = GangState.capture()
    for name, args in cases:
        try:
            value = run_case(rank, world, args)
        except BaseException:  # noqa: BLE001 - reported to the test, then this rank ends
            out.put((name, rank, False, traceback.format_exc()))
            finish_reporting(out)
            raise
        out.put((name, rank, True, value if rank == 0 else None))
        state.after_trial()
    close_distributed()
    finish_reporting(out)


def trial_curves_case(rank: int, world: int, overrides: list[str]) -> tuple[list[float], list[float], str]:
    """A spawn_cases case: one trial through the real trainer (`run_trial`) with `overrides`
    (cluster.num_workers set to `world`); (train losses, val losses, status) as rank 0's
    tracker recorded them."""
    from conftest import RecordingTracker
    from trainlab import names
    from trainlab.config import compose_run_config
    from trainlab.engine.run import run_trial

    tracker = RecordingTracker()
    result = run_trial(plan_here(compose_run_config([*overrides, f"cluster.num_workers={world}"])),
                       tracker_factory=lambda *_: tracker)
    return ([v for _, v in tracker.series(names.LOSS)], [v for _, v in tracker.series(names.VAL_LOSS)],
            result.status)


def selected_cases(request, param: str = "case") -> set[str]:
    """The values of parameter `param` among the tests of the requesting module that this session
    runs (after -k / -m deselection): a module fixture runs only the cases someone asserts on."""
    return {item.callspec.params[param] for item in request.session.items
            if item.module is request.module and param in getattr(getattr(item, "callspec", None), "params", {})}
