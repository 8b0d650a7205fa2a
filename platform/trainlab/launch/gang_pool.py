"""Warm gangs: a sweep's trials of the same gang shape run one after another on a gang that
stays up, instead of each paying for Ray Train's controller, its worker group's start and a
fresh Python with torch.

A warm gang is ONE Ray Train run (TorchTrainer.fit) whose worker function is a loop over a
queue held by the driver (launch.gang_queue, launch.gang_worker). The driver runs K slots for
K concurrent trials (hydra.launcher.max_concurrent_trials); each slot keeps at most one gang
and gives it the next pending trial of its shape (worker count, resources per worker,
placement, device) that engine.isolation lets follow the trials it ran, preferring those; a
trial no warm gang may take gets a fresh gang (the slot's old one ends first, so no idle gang
holds resources), an elastic trial a gang of its own (launch.ray_trial.run_on_ray). The choice
is recorded on the trial's run (tag `gang`). Each trial keeps the driver work of a trial of
its own (launch.lifecycle.train: checks, resume, its MLflow run, its summary); only the runner
differs: WarmGang.run, with run_on_ray's signature.

Faults: a trial that fails makes Ray Train restart the gang's worker group (the gang's
FailureConfig covers every trial of its shape); the queue resumes the trial in flight or, past
its cluster.max_failures, fails it, and the gang goes on. If the whole Ray Train run fails,
its trial in flight fails with Ray's error and the slot starts a new gang for what is left.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, Sequence

from trainlab.config import RunConfig
from trainlab.engine.isolation import fresh_gang_reason
from trainlab.events import ProgressEvent, TrialResult
from trainlab.launch import interrupt
from trainlab.launch.interrupt import GangStop, StopRequest
from trainlab.launch.placement import scaling
from trainlab.plan.trial_plan import TrialPlan
from trainlab.tracking.trial_tracking import TrackingTarget

TAKE_TIMEOUT_S = 0.5
"""How long one wait for a trial's events lasts before the driver looks at its interrupt."""
RENEW_S = 5.0
"""How often an idle slot renews its kept gang's claim (launch.kept_gang.CLAIM_LAPSE_S)."""


class TrialFailed(RuntimeError):
    """A trial on a warm gang failed (past its max_failures): the error its worker reported,
    or Ray's reason when the worker died."""


def shape_key(plan: TrialPlan) -> str:
    """What a gang's workers are: trials with the same key can share a gang."""
    return json.dumps({"device": plan.device, "scaling": scaling(plan.gang)}, sort_keys=True, default=str)


def gang_trainer(queue, *, name: str, device: str, scaling: dict, budget: int, storage_path: str):
    """The Ray Train run of a warm gang: its workers loop over `queue` (launch.gang_worker),
    `budget` restarts of its worker group (FailureConfig), each failure's reason handed to the
    queue. `scaling`: launch.placement.scaling of the gang. Fitted by the driver (WarmGang) or
    by a keeper (launch.kept_gang)."""
    from trainlab.launch.gang_queue import failure_callback
    from trainlab.launch.gang_worker import gang_loop
    from trainlab.launch.ray_train_run import gang_run

    return gang_run(gang_loop, {"queue": queue, "device": device}, device=device, scaling=scaling, name=name,
                    storage_path=storage_path, max_failures=budget, callbacks=[failure_callback(queue)])


class WarmGang:
    """One warm gang: its queue and its Ray Train run, fitted in a thread of the driver, or by a
    keeper that outlives the command (`keep_warm_s` > 0, launch.kept_gang), which is its queue too."""

    def __init__(self, *, number: int, plan: TrialPlan, key: str, budget: int, storage_path: str,
                 keep_warm_s: float = 0, owner: str = "", kept: tuple | None = None):
        """`kept`: (keeper, the runs it ran) claimed from an earlier command (kept_gang.claim_kept)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from trainlab.launch.gang_queue import start_queue
        from trainlab.launch.kept_gang import start_keeper

        self.number, self.key, self.device = number, key, plan.device
        self.ran: list[RunConfig] = list(kept[1]) if kept else []
        """The trials this gang took, in order (engine.isolation decides who may follow)."""
        self.reclaimed = kept is not None
        """Kept warm by an earlier command: its first trial here is not a gang start."""
        self._seq = itertools.count(1)
        self._error: BaseException | None = None
        self._owner, self._renewed, self._keep_warm_s = owner, time.monotonic(), keep_warm_s
        self.abandoned = False
        """A trial on it was let go at an interrupt: Ray's shutdown ends the gang."""
        self._thread: threading.Thread | None = None
        self._keeper = None
        if kept:
            self.queue = self._keeper = kept[0]
            return
        # on the driver's node, as Ray Train's controller is: a lost worker node must not take it along
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        spec = {"name": f"gang{number}", "device": plan.device, "scaling": scaling(plan.gang), "budget": budget,
                "storage_path": storage_path}
        if keep_warm_s > 0:
            self.queue = self._keeper = start_keeper(key=key, device=plan.device, spec=spec, keep_warm_s=keep_warm_s,
                                                     owner=owner, scheduling_strategy=here)
            return
        self.queue = start_queue(scheduling_strategy=here)
        self._trainer = gang_trainer(self.queue, **spec)
        self._thread = threading.Thread(target=self._fit, name=f"gang{number}-fit", daemon=True)
        self._thread.start()

    def _fit(self) -> None:
        try:
            self._trainer.fit()
        except BaseException as e:  # raised to the trial in flight (WarmGang.run)
            self._error = e

    @property
    def alive(self) -> bool:
        if self._keeper is None:
            return self._thread.is_alive()
        return self._kept_state()["alive"]

    def _kept_state(self) -> dict:
        import ray

        try:
            state = ray.get(self._keeper.state.remote(self._owner), timeout=60)
        except ray.exceptions.RayError as e:  # the keeper is gone (its node, `ray stop`)
            state = {"alive": False, "error": f"the gang's keeper is gone: {e}"}
        if not state["alive"] and state["error"] and self._error is None:
            self._error = RuntimeError(state["error"])
        return state

    def renew(self) -> None:
        """A kept gang between trials: its claim renewed every RENEW_S (kept_gang.CLAIM_LAPSE_S)."""
        now = time.monotonic()
        if self._keeper is not None and now - self._renewed > RENEW_S:
            self._renewed = now
            self._keeper.state.remote(self._owner)

    def run(self, plan: TrialPlan, *, name: str, tracking: TrackingTarget,
            on_event: Callable[[ProgressEvent], None], stop: StopRequest | None = None) -> TrialResult | None:
        """launch.lifecycle.train's runner (run_on_ray's signature): the trial on this gang; rank 0's
        result, None when let go at an interrupt. Raises TrialFailed, or the Ray Train run's error."""
        import ray
        from ray.exceptions import GetTimeoutError

        from trainlab.launch.ray_trial import run_on_ray

        if shape_key(plan) != self.key:  # planned otherwise than the pool saw it: a gang of its own
            return run_on_ray(plan, name=name, tracking=tracking, on_event=on_event, stop=stop)
        # unique across commands: a kept gang's queue holds the outcomes of an earlier owner's trials too
        key = f"{self._owner} gang {self.number}.{next(self._seq)}" if self._keeper is not None \
            else f"{self.number}.{next(self._seq)}"
        payload = [ray.put({"plan": plan, "tracking": tracking})]  # nested: the queue keeps the ref (Ticket)
        ray.get(self.queue.submit.remote(key, payload, plan.run.cluster.max_failures))
        # a signal on the driver (PREEMPT) or the pruner's request (PRUNE), through the queue
        stop = GangStop(None, request=stop, ask=lambda kind: self.queue.stop.remote(key, kind))
        while not stop.give_up():
            ended = not self.alive  # looked at before the take: an outcome sent before the end is in it
            try:
                events, outcome = ray.get(self.queue.take.remote(key, TAKE_TIMEOUT_S),
                                          timeout=60 * TAKE_TIMEOUT_S)
            except GetTimeoutError:  # a busy machine: ask again
                continue
            for event in events:
                stop.saw(event)
                on_event(event)
            if outcome is not None:
                if "error" in outcome:
                    raise TrialFailed(outcome["error"])
                return outcome["result"]
            if ended:
                raise self._error or RuntimeError("the gang ended without reporting a result")
        self.queue.withdraw.remote(key)  # let go before a worker took it: it must not start later
        self.abandoned = True
        return None

    def close(self, *, keep: bool = False) -> None:
        """No more trials: the gang's loop ends after the one it runs; `keep` (a kept gang whose
        run is alive, the multirun done): released, warm for the next command instead."""
        if self._keeper is not None and keep and not self.abandoned and self.alive:
            import ray

            # waited for: a call left in flight is lost when the command exits, the gang owned by no one
            try:
                ray.get(self._keeper.release.remote(self._owner, self.ran, self._keep_warm_s), timeout=60)
            except ray.exceptions.RayError:  # gone meanwhile: nothing left to keep
                pass
            return
        self.queue.end.remote()

    def join(self) -> None:
        """Wait for the Ray Train run to end and remove the queue (not after an interrupt let a
        trial go: Ray's shutdown ends it; a kept gang's keeper ends its run and itself)."""
        from trainlab.launch.event_stream import end_gracefully

        if self.abandoned or self._keeper is not None:
            return
        self._thread.join()
        end_gracefully(self.queue)


@dataclasses.dataclass(frozen=True)
class _Planned:
    plan: TrialPlan
    key: str
    """shape_key: trials of the same key may share a gang."""
    solo: str
    """Why the trial runs on a gang of its own ("" if it may share one)."""


RunOne = Callable[..., None]
"""(trial, *, runner, gang_tag) -> None: the study's per-trial work (launch.lifecycle.train and reporting)."""


class GangPool:
    """K slots, each running trials on at most one warm gang at a time (see the module docstring).

    The pool belongs to the whole multirun (launch.study): a sweeper's batches are submitted one
    after another and a slot keeps its gang warm between them, so a later batch starts on warm
    gangs like the later trials of a grid. `close` ends the gangs."""

    def __init__(self, *, storage_path: str, expected_trials: int = 0, keep_warm_s: float = 0):
        """`expected_trials`: how many trials the multirun may submit in all (a sweeper's n_trials;
        0 = those submitted): each gang's restart budget covers them. `keep_warm_s` > 0
        (hydra.launcher.keep_warm_s): gangs are kept by keepers (launch.kept_gang) that outlive
        the command; a free one an earlier command kept is taken before a gang is started."""
        from trainlab.launch.kept_gang import driver_id

        self._keep_warm_s = keep_warm_s
        self._owner = driver_id() if keep_warm_s > 0 else ""
        self._run_of: dict[int, RunOne] = {}
        self._storage_path = storage_path
        self._expected = expected_trials
        self._changed = threading.Condition()
        self._pending: list = []
        self._planned: dict = {}
        self._done: dict[int, threading.Event] = {}
        self._budget: dict[str, int] = {}
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._numbers = itertools.count(1)
        self.gangs: list[WarmGang] = []

    def submit(self, trials: Sequence, *, slots: int, run_one: RunOne) -> None:
        """Queue `trials` (each with its plan, t.plan, made on the driver before any starts), each
        to be run by `run_one`, up to `slots` at once (slots only grow: a warm gang is never dropped
        for a smaller batch)."""
        with self._changed:
            for t in trials:
                self._run_of[t.idx] = run_one
                planned = self._planned[t.idx] = _plan(t.plan)
                # restarts a gang may need: every trial of its shape failing each of its attempts
                self._budget[planned.key] = self._budget.get(planned.key, 0) + t.run.cluster.max_failures + 1
                self._done[t.idx] = threading.Event()
                self._pending.append(t)
            for i in range(len(self._threads), max(1, slots)):
                thread = threading.Thread(target=self._slot, name=f"gang-slot{i}", daemon=True)
                self._threads.append(thread)
                thread.start()
            self._changed.notify_all()

    def wait(self, trials: Sequence) -> None:
        """Until each of `trials` ended (after an interrupt: until those started ended; the rest stay pending)."""
        for t in trials:
            self._done[t.idx].wait()

    def close(self) -> None:
        """No more trials: each slot's gang ends after the trial it runs."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        for t in self._threads:
            t.join()
        for gang in self.gangs:
            gang.join()

    def _next(self, gang: WarmGang | None):
        """The slot's next (trial, reason) as _pick gives it, waiting while nothing is pending;
        None once the pool closes or a signal stops the multirun (pending trials are then let go)."""
        with self._changed:
            while True:
                if interrupt.current().signum:
                    for t in self._pending:  # never started: left for the rerun
                        self._done[t.idx].set()
                    self._pending.clear()
                    return None
                picked = self._pick(gang)
                if picked is not None:
                    return picked
                if self._closing:
                    return None
                if gang is not None:  # a kept gang's claim lapses unless its driver calls it
                    gang.renew()
                self._changed.wait(TAKE_TIMEOUT_S)  # a signal is looked at between waits

    def _slot(self) -> None:
        gang: WarmGang | None = None
        lost = ""  # why the slot has no gang though it had one
        try:
            while (picked := self._next(gang)) is not None:
                trial, reason = picked
                try:
                    planned = self._planned[trial.idx]
                    if planned.solo:  # its own gang, as without warm gangs
                        if gang is not None:
                            gang.close()
                            gang = None
                        self._run_one_safely(trial, runner=None, gang_tag=f"fresh: {planned.solo}")
                        continue
                    if reason:
                        if gang is not None:
                            gang.close()  # before the new one asks for its resources
                        gang = self._start(planned)
                        if gang.reclaimed:
                            tag = f"warm #{len(gang.ran) + 1} on gang {gang.number} (kept from an earlier command)"
                        else:
                            tag = f"fresh: {lost or reason} (gang {gang.number})"
                        lost = ""
                    else:
                        tag = f"warm #{len(gang.ran) + 1} on gang {gang.number}"
                    gang.ran.append(trial.run)
                    self._run_one_safely(trial, runner=gang.run, gang_tag=tag)
                    if not gang.alive:  # its Ray Train run failed: the next trial gets a new gang
                        gang, lost = None, f"gang {gang.number} failed"
                finally:
                    self._done[trial.idx].set()
        finally:
            if gang is not None:  # kept for the next command if the multirun ended as planned
                gang.close(keep=self._closing and not interrupt.current().signum)

    def _run_one_safely(self, trial, **kwargs) -> None:
        try:
            self._run_of[trial.idx](trial, **kwargs)
        except Exception:  # noqa: BLE001 - a bug in one trial's reporting must not strand the trials after it
            traceback.print_exc()

    def _pick(self, gang: WarmGang | None):
        """(trial, "") for the next trial that may follow on `gang`; else (the first pending
        trial, why it needs a fresh gang); None when nothing is pending. Under the lock."""
        if not self._pending:
            return None
        if gang is not None and gang.alive:
            for t in self._pending:
                planned = self._planned[t.idx]
                if (not planned.solo and planned.key == gang.key
                        and not fresh_gang_reason(ran=gang.ran, run=t.run, device=gang.device)):
                    self._pending.remove(t)
                    return t, ""
        t = self._pending.pop(0)
        planned = self._planned[t.idx]
        if gang is not None and gang.alive and planned.key == gang.key:
            # engine.isolation's reason reads "fresh gang: why"; the tag says "fresh: why"
            return t, fresh_gang_reason(ran=gang.ran, run=t.run, device=gang.device).removeprefix("fresh gang: ")
        return t, "no warm gang of its shape"

    def _start(self, planned: _Planned) -> WarmGang:
        with self._changed:
            budget = self._budget[planned.key]
            if self._expected:  # a sweeper's later batches may bring as many again of this shape
                budget = max(budget, self._expected * (planned.plan.run.cluster.max_failures + 1))
            number = next(self._numbers)
        kept = None
        if self._keep_warm_s > 0:
            from trainlab.launch.kept_gang import claim_kept

            run, device = planned.plan.run, planned.plan.device
            kept = claim_kept(planned.key, owner=self._owner, keep_warm_s=self._keep_warm_s,
                              fits=lambda ran: not fresh_gang_reason(ran=ran, run=run, device=device))
        if kept is None:  # a free kept gang (an earlier command's) must not hold what this one needs
            from trainlab.launch.kept_gang import make_room

            make_room(scaling(planned.plan.gang))
        gang = WarmGang(number=number, plan=planned.plan, key=planned.key, budget=budget,
                        storage_path=self._storage_path, keep_warm_s=self._keep_warm_s, owner=self._owner, kept=kept)
        with self._changed:
            self.gangs.append(gang)
        return gang


def _plan(plan: TrialPlan) -> _Planned:
    solo = ""
    if plan.gang.elastic:
        solo = (f"elastic (cluster.min_workers={plan.run.cluster.min_workers}): a resize restarts Ray Train's "
                "worker group at another size")
    return _Planned(plan=plan, key=shape_key(plan), solo=solo)


def storage_path_of(trials: Sequence) -> str:
    """Where the gangs' Ray Train runs keep their files: beside the trials' output folders."""
    first = trials[0].run.output_dir or "."
    return str(Path(first).resolve().parent / "ray")
