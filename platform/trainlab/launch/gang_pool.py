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


class TrialFailed(RuntimeError):
    """A trial on a warm gang failed (past its max_failures): the error its worker reported,
    or Ray's reason when the worker died."""


def shape_key(plan: TrialPlan) -> str:
    """What a gang's workers are: trials with the same key can share a gang."""
    return json.dumps({"device": plan.device, "scaling": scaling(plan.gang)}, sort_keys=True, default=str)


class WarmGang:
    """One warm gang: its queue actor and its Ray Train run (fit() in a thread)."""

    def __init__(self, *, number: int, plan: TrialPlan, key: str, budget: int, storage_path: str):
        import ray
        from ray.train import FailureConfig, ScalingConfig
        from ray.train import RunConfig as RayRunConfig
        from ray.train.torch import TorchTrainer
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from trainlab.distributed import backend_for
        from trainlab.launch.gang_queue import failure_callback, start_queue
        from trainlab.launch.gang_worker import gang_loop
        from trainlab.launch.rendezvous import BoundTorchConfig

        self.number, self.key, self.device = number, key, plan.device
        self.ran: list[RunConfig] = []
        """The trials this gang took, in order (engine.isolation decides who may follow)."""
        self._seq = itertools.count(1)
        self._error: BaseException | None = None
        self.abandoned = False
        """A trial on it was let go at an interrupt: Ray's shutdown ends the gang."""
        # on the driver's node, as Ray Train's controller is: a lost worker node must not take it along
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.queue = start_queue(scheduling_strategy=here)
        self._trainer = TorchTrainer(
            gang_loop,
            train_loop_config={"queue": self.queue, "device": plan.device},
            torch_config=BoundTorchConfig(backend=backend_for(plan.device)),
            scaling_config=ScalingConfig(**scaling(plan.gang)),
            run_config=RayRunConfig(name=f"gang{number}", storage_path=storage_path,
                                    failure_config=FailureConfig(max_failures=budget),
                                    callbacks=[failure_callback(self.queue)]),
        )
        self._thread = threading.Thread(target=self._fit, name=f"gang{number}-fit", daemon=True)
        self._thread.start()

    def _fit(self) -> None:
        try:
            self._trainer.fit()
        except BaseException as e:  # raised to the trial in flight (WarmGang.run)
            self._error = e

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def run(self, plan: TrialPlan, *, name: str, tracking: TrackingTarget,
            on_event: Callable[[ProgressEvent], None], stop: StopRequest | None = None) -> TrialResult | None:
        """launch.lifecycle.train's runner (run_on_ray's signature): the trial on this gang; rank 0's
        result, None when let go at an interrupt. Raises TrialFailed, or the Ray Train run's error."""
        import ray
        from ray.exceptions import GetTimeoutError

        from trainlab.launch.ray_trial import run_on_ray

        if shape_key(plan) != self.key:  # planned otherwise than the pool saw it: a gang of its own
            return run_on_ray(plan, name=name, tracking=tracking, on_event=on_event, stop=stop)
        key = f"{self.number}.{next(self._seq)}"
        payload = {"plan": plan, "tracking": tracking}
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

    def close(self) -> None:
        """No more trials: the gang's loop ends after the one it runs."""
        self.queue.end.remote()

    def join(self) -> None:
        """Wait for the Ray Train run to end and remove the queue (not after an interrupt let a
        trial go: Ray's shutdown ends it)."""
        import ray

        if self.abandoned:
            return
        self._thread.join()
        ray.kill(self.queue)


@dataclasses.dataclass(frozen=True)
class _Planned:
    plan: TrialPlan
    key: str
    """shape_key: trials of the same key may share a gang."""
    solo: str
    """Why the trial runs on a gang of its own ("" if it may share one)."""


RunOne = Callable[..., None]
"""(trial, *, runner, gang_tag) -> None: sweep's per-trial work (launch.lifecycle.train and reporting)."""


class GangPool:
    """K slots, each running trials on at most one warm gang at a time (see the module docstring)."""

    def __init__(self, trials: Sequence, *, slots: int, run_one: RunOne, storage_path: str):
        """`trials`: each with its plan (t.plan), made on the driver before the first starts."""
        self._pending = list(trials)
        self._slots = max(1, min(slots, len(self._pending)))
        self._run_one = run_one
        self._storage_path = storage_path
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        self.gangs: list[WarmGang] = []
        self._planned = {t.idx: _plan(t.plan) for t in self._pending}
        keys = [p.key for p in self._planned.values()]
        # restarts a gang may need: every trial of its shape failing each of its attempts
        self._budget = {k: sum(t.run.cluster.max_failures + 1 for t in self._pending
                               if self._planned[t.idx].key == k) for k in set(keys)}

    def run(self) -> None:
        """Run every trial (until an interrupt: those not started stay pending)."""
        threads = [threading.Thread(target=self._slot, name=f"gang-slot{i}", daemon=True)
                   for i in range(self._slots)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for gang in self.gangs:
            gang.join()

    def _slot(self) -> None:
        gang: WarmGang | None = None
        lost = ""  # why the slot has no gang though it had one
        try:
            while not interrupt.current().signum:
                with self._lock:
                    picked = self._pick(gang)
                if picked is None:
                    break
                trial, reason = picked
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
                    gang = self._start(trial, planned)
                    tag = f"fresh: {lost or reason} (gang {gang.number})"
                    lost = ""
                else:
                    tag = f"warm #{len(gang.ran) + 1} on gang {gang.number}"
                gang.ran.append(trial.run)
                self._run_one_safely(trial, runner=gang.run, gang_tag=tag)
                if not gang.alive:  # its Ray Train run failed: the next trial gets a new gang
                    gang, lost = None, f"gang {gang.number} failed"
        finally:
            if gang is not None:
                gang.close()

    def _run_one_safely(self, trial, **kwargs) -> None:
        try:
            self._run_one(trial, **kwargs)
        except Exception:  # noqa: BLE001 - a bug in one trial's reporting must not strand the trials after it
            traceback.print_exc()

    def _pick(self, gang: WarmGang | None):
        """(trial, "") for the next trial that may follow on `gang`; else (the first pending
        trial, why it needs a fresh gang); None when nothing is left."""
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

    def _start(self, trial, planned: _Planned) -> WarmGang:
        gang = WarmGang(number=next(self._numbers), plan=planned.plan, key=planned.key,
                        budget=self._budget[planned.key], storage_path=self._storage_path)
        with self._lock:
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
