"""Warm gangs kept between commands on a running cluster (hydra.launcher.keep_warm_s).

    keeper = start_keeper(key=..., device=..., spec=..., keep_warm_s=600, owner=me)  # a new one
    claimed = claim_kept(key, owner=me)   # or one an earlier command left: (keeper, the runs it ran)
    ...                                   # its queue is the keeper itself (launch.gang_queue)
    keeper.release.remote(me, ran, 600)   # warm for 600 s more (this command's keep_warm_s)

A warm gang (launch.gang_pool) is one Ray Train run whose workers take trial after trial from
a queue. Its Ray Train run is owned by whoever called fit(): in the driver, it ends with the
command. Here fit() runs in a detached actor, the GangKeeper, which is also the gang's queue:
the gang outlives the command that started it, and the next sweep on the same cluster (the
same `cluster.address`) takes it instead of starting one, its first trial starting in the
second or so a later trial of a warm gang takes.

One owner at a time: a driver claims a keeper (an atomic call of the actor) and holds it while
it calls it (every call renews the claim); released, or unrenewed for CLAIM_LAPSE_S (a driver
SIGKILLed), it is free again, and after keep_warm_s free it ends its gang and itself; free, it
also ends them for any placement group that waits for what its gang holds (a cache, not a reservation). Isolation
is the warm gang's (engine.isolation): the keeper holds the runs its gang ran, the claiming
driver lets a trial follow them only where fresh_gang_reason allows it, and every worker puts
its process back after each trial as it does on any warm gang.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
import uuid

from trainlab.launch.gang_queue import GangQueue

NAMESPACE = "trainlab"
"""The Ray namespace of the keepers (named detached actors are found by name within one)."""
PREFIX = "trainlab-gang-"
CLAIM_LAPSE_S = 60.0
"""A claim no call has renewed for this long is let go: its driver is gone (SIGKILL, a lost
node). A live driver calls its gangs at least every few seconds (GangPool renews idle ones)."""
WATCH_S = 1.0
"""How often a keeper looks at its claim and its idle time."""
YIELD_CHECKS = 2
"""A free kept gang ends once the same placement group has waited this many watches in a row for
a resource the gang holds (one wait is every new group's first moment, not a shortage)."""


def driver_id() -> str:
    """Who claims: this process, unique across hosts and restarts."""
    import os
    import socket

    return f"{socket.gethostname()} pid {os.getpid()} {uuid.uuid4().hex[:8]}"


def _name_prefix(key: str) -> str:
    return f"{PREFIX}{hashlib.sha256(key.encode()).hexdigest()[:12]}-"


class GangKeeper(GangQueue):
    """The actor's class (start_keeper makes it remote, detached): a warm gang's queue that also
    runs its Ray Train run and keeps it between commands."""

    def __init__(self, *, key: str, device: str, keep_warm_s: float, owner: str) -> None:
        super().__init__()
        self.key, self.device, self._keep_warm_s = key, device, keep_warm_s
        self._owner, self._touched = owner, time.monotonic()
        self._idle_since = time.monotonic()
        self._ran: list = []
        self._fit: threading.Thread | None = None
        self._fit_error = ""
        self._watch: asyncio.Task | None = None
        self._holds: set[str] = set()
        """The resources its gang's workers hold (a waiting placement group needing one ends it, free)."""
        self._waiting: dict[str, int] = {}
        """Placement groups seen waiting for what it holds: id -> watches in a row."""

    async def start(self, spec: dict) -> None:
        """Build and fit the gang's Ray Train run (launch.gang_pool.gang_trainer) on this actor's
        own handle as its queue, and watch the claim and the idle time."""
        import ray

        from trainlab.launch.gang_pool import gang_trainer

        trainer = gang_trainer(ray.get_runtime_context().current_actor, **spec)
        self._holds = {k for k, v in spec["scaling"]["resources_per_worker"].items() if v}

        def fit() -> None:
            try:
                trainer.fit()
            except BaseException as e:  # noqa: BLE001 - reported to the trial in flight by the driver
                self._fit_error = f"{type(e).__name__}: {e}"

        self._fit = threading.Thread(target=fit, name="kept-gang-fit", daemon=True)
        self._fit.start()
        self._watch = asyncio.get_running_loop().create_task(self._watch_loop())

    def state(self, owner: str) -> dict:
        """{"alive", "error"} of the gang's Ray Train run; a call of `owner` renews its claim."""
        self._renew(owner)
        return {"alive": self._fit is not None and self._fit.is_alive(), "error": self._fit_error}

    def claim(self, owner: str, key: str) -> list | None:
        """The runs this gang ran (engine.isolation decides who may follow them), now owned by
        `owner`; None if it is another shape's, owned, ended or its run failed."""
        if key != self.key or self._owner or self._ended or self._fit is None or not self._fit.is_alive():
            return None
        self._owner, self._touched = owner, time.monotonic()
        return list(self._ran)

    def release(self, owner: str, ran: list, keep_warm_s: float) -> None:
        """`owner` is done with it: free again, warm for `keep_warm_s` (the releasing command's
        hydra.launcher.keep_warm_s); `ran`: the runs its gang ran."""
        if self._owner == owner:
            self._ran, self._owner, self._idle_since = list(ran), "", time.monotonic()
            self._keep_warm_s = keep_warm_s
            # what its trials left in the queue is the owner's alone: the next owner starts empty
            self._outcomes.clear()
            self._events.clear()
            self._stops.clear()

    async def end_if_free(self) -> bool:
        """End the gang (and this keeper after it) if no one owns it: room for another gang."""
        if self._owner or self._ended:
            return False
        await self.end()
        return True

    async def submit(self, key: str, payload: list, max_failures: int) -> None:
        self._renew_any()
        await super().submit(key, payload, max_failures)

    async def take(self, key: str, timeout: float):
        self._renew_any()
        return await super().take(key, timeout)

    def _renew(self, owner: str) -> None:
        if owner and owner == self._owner:
            self._touched = time.monotonic()

    def _renew_any(self) -> None:  # submit and take come only from the owner's driver
        if self._owner:
            self._touched = time.monotonic()

    def _wanted(self) -> bool:
        """Whether a placement group has waited YIELD_CHECKS watches in a row for a resource this
        free gang holds: a gang whose start lost the race for the CPUs make_room freed (two
        gangs of one sweep starting at once each saw room for itself), a run that started without
        asking for room, another Ray application's."""
        import ray

        waiting = {pg_id for pg_id, pg in ray.util.placement_group_table().items() if pg["state"] == "PENDING"
                   and any(self._holds & {k for k, v in b.items() if v} for b in pg["bundles"].values())}
        self._waiting = {pg_id: self._waiting.get(pg_id, 0) + 1 for pg_id in waiting}
        return any(n >= YIELD_CHECKS for n in self._waiting.values())

    async def _watch_loop(self) -> None:
        import ray

        while True:
            await asyncio.sleep(WATCH_S)
            now = time.monotonic()
            if self._owner and now - self._touched > CLAIM_LAPSE_S and self._in_flight is None:
                self._owner, self._idle_since = "", now  # its driver is gone
            if not self._owner and now - self._idle_since > self._keep_warm_s and not self._ended:
                await self.end()
            if not self._owner and not self._ended and await asyncio.to_thread(self._wanted):
                await self.end()  # a cache, not a reservation: another gang waits for what it holds
            if self._ended and (self._fit is None or not self._fit.is_alive()):
                # its gang has ended: the keeper goes too (exit_actor ends only a method's call)
                ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
                return


def start_keeper(*, key: str, device: str, spec: dict, keep_warm_s: float, owner: str, scheduling_strategy=None):
    """A new GangKeeper (detached, named by its shape in NAMESPACE) owned by `owner`, its gang starting."""
    import ray

    options = {"name": f"{_name_prefix(key)}{uuid.uuid4().hex[:8]}", "namespace": NAMESPACE,
               "lifetime": "detached", "max_concurrency": 1000}
    if scheduling_strategy is not None:
        options["scheduling_strategy"] = scheduling_strategy
    keeper = ray.remote(num_cpus=0)(GangKeeper).options(**options).remote(
        key=key, device=device, keep_warm_s=keep_warm_s, owner=owner)
    ray.get(keeper.start.remote(spec))
    return keeper


def claim_kept(key: str, *, owner: str, keep_warm_s: float, fits=lambda ran: True):
    """(keeper, the runs its gang ran) of a free kept gang of shape `key` that `fits` accepts
    (engine.isolation: may the trial follow those runs?), now owned by `owner`; None if none.
    A keeper claimed but refused by `fits` is released again, warm for `keep_warm_s`."""
    import ray

    prefix = _name_prefix(key)
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a.get("namespace") == NAMESPACE and a["name"].startswith(prefix)]
    for name in sorted(names):
        try:
            keeper = ray.get_actor(name, namespace=NAMESPACE)
            ran = ray.get(keeper.claim.remote(owner, key), timeout=30)
        except (ValueError, ray.exceptions.RayError):  # ended meanwhile
            continue
        if ran is None:
            continue
        if fits(ran):
            return keeper, ran
        ray.get(keeper.release.remote(owner, ran, keep_warm_s))
    return None


def kept_gangs() -> list[str]:
    """The names of the keepers on the connected cluster (tests, `ray list actors` shows them too)."""
    import ray

    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a.get("namespace") == NAMESPACE and a["name"].startswith(PREFIX))


def end_kept_gangs() -> list[str]:
    """End every kept gang on the connected cluster after the trial it runs (the bench's cleanup);
    the names of those ended."""
    import ray

    ended = []
    for name in kept_gangs():
        try:
            ray.get(ray.get_actor(name, namespace=NAMESPACE).end.remote(), timeout=30)
            ended.append(name)
        except (ValueError, ray.exceptions.RayError):  # ended meanwhile
            pass
    return ended


ROOM_WAIT_S = 60.0
"""How long make_room waits for an ended kept gang's resources to come back."""


def make_room(scaling: dict) -> list[str]:
    """End free kept gangs, of any shape, while the cluster has fewer resources available than a
    gang of `scaling` (launch.placement.scaling) needs: a new gang never waits behind an idle
    kept one (kept gangs are a cache, not a reservation). The names of those ended."""
    import ray

    per_worker = scaling.get("resources_per_worker", {})
    workers = scaling["num_workers"]
    workers = workers[0] if isinstance(workers, tuple) else workers  # elastic: its fewest
    need = {k: v * workers for k, v in per_worker.items()}

    def short() -> bool:
        available = ray.available_resources()
        return any(available.get(k, 0) < v for k, v in need.items())

    ended: list[str] = []
    for name in kept_gangs():
        if not short():
            break
        try:
            if not ray.get(ray.get_actor(name, namespace=NAMESPACE).end_if_free.remote(), timeout=30):
                continue
        except (ValueError, ray.exceptions.RayError):  # ended meanwhile
            continue
        ended.append(name)
        deadline = time.monotonic() + ROOM_WAIT_S
        while name in kept_gangs() and time.monotonic() < deadline:  # its workers give their resources back
            time.sleep(0.5)
    return ended
