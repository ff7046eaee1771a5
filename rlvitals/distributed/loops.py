"""How rollouts arrive in Ray mode (in lockstep, or whichever is first), and `train_ray`.

Both sources hand each batch to the shared `Run.learn_step`; they differ from
local mode, and from each other, only in where the batch comes from.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from rlvitals.actors.rollout import Rollout
from rlvitals.learner.transfer import pin_rollout

from ..archive import RunArchive
from ..config import TrainConfig
from ..evidence import WeightLoads
from ..parts import env_spaces, seed_everything
from ..rows import RowObserver
from ..run import Run, run_info
from .accounting import ActorAccounts, final_counters
from .connect import start_ray, stop_ray
from .fleet import Fleet
from .readiness import ReadyWaits


class SyncRollouts:
    """Every round, all actors act with the newest weights; the learner waits for every one of them."""

    def __init__(self, run: Run, fleet: Fleet):
        self.run, self.fleet, self.ray = run, fleet, fleet.ray
        self.accounts, self.loads = ActorAccounts(), WeightLoads()
        run.actor_accounts = DriverStatistics(self.accounts, self.loads)

    def next(self) -> Rollout:
        run, fleet, ray = self.run, self.fleet, self.ray
        weights, weights_age = fleet.publish(run.net)
        self.loads.published(weights_age)
        requested_age = run.net.age     # every request of the round, restarts' included
        with run.telemetry.phase("publish"):  # the fingerprint of the weights handed out
            run.weights_handed_out()
        with run.telemetry.phase("wait"):
            refs = dict(fleet.submit(i, weights, weights_age) for i in range(fleet.num_actors))
            rollouts: dict[int, Rollout] = {}
            while refs:
                ready, _ = ray.wait(list(refs), num_returns=1)
                task = refs.pop(ready[0])
                try:
                    rollouts[task[0]] = ray.get(ready[0])
                    self.accounts.arrived(rollouts[task[0]])
                    self.loads.arrived(rollouts[task[0]])
                    run.acted(requested_age, rollouts[task[0]], weights_age)
                except ray.exceptions.RayError as exc:
                    fleet.actor_failed(task, exc)
                    fleet.wait_until_back(task[0])
                    ref, task = fleet.submit(task[0], weights, weights_age)
                    refs[ref] = task
            batch = Rollout.concat([rollouts[i] for i in sorted(rollouts)])
        with run.telemetry.phase("telemetry"):
            run.queue(0, fleet.num_actors)
        return batch

    def drain(self) -> None:
        # Every round is taken whole: nothing is in flight; the actors' own counts close the accounting.
        self.accounts.final(final_counters(self.ray, self.fleet.actors, DRAIN_SECONDS))

    def summary(self) -> dict:
        return _summary(self.run.cfg, self.fleet, self.accounts)


class AsyncRollouts:
    """Learn from whichever rollout arrives first; keep every actor `rollouts_in_flight` requests ahead.

    The actor whose rollout is being learned from gets its next request, with the
    weights that learning produced, when the learner asks for the next batch.
    Rollouts more than `max_staleness` learner steps old are dropped (counted).
    While the learner learns, the next finished rollout is already fetched and unpacked
    (`ray.get`) in a background thread, so with a full queue the learner's wait is short.
    """

    def __init__(self, run: Run, fleet: Fleet):
        self.run, self.fleet, self.ray = run, fleet, fleet.ray
        self.per_actor = run.cfg.rollouts_in_flight
        self.capacity = fleet.num_actors * self.per_actor
        self.loads = WeightLoads()
        self.weights, self.weights_age = self._publish()
        run.weights_handed_out()
        self.in_flight: dict = {}
        """object ref of a requested rollout -> task (actor index, generation)."""
        self.request_ages: dict = {}
        """object ref of a requested rollout -> (the learner's network age then, the age of the weights handed,
        time.time() of the request)."""
        self.accounts = ActorAccounts()
        self.waits = ReadyWaits()
        run.actor_accounts = DriverStatistics(self.accounts, self.waits, self.loads)
        self.owed: int | None = None
        self.fetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-fetch")
        self.prefetched: tuple | None = None
        """(ref, task, future of its ray.get): the next rollout, taken out of `in_flight`, fetched in the background."""
        for _ in range(self.per_actor):
            for i in range(fleet.num_actors):
                self._submit(i)

    def _submit(self, i: int) -> None:
        ref, task = self.fleet.submit(i, self.weights, self.weights_age)
        self.in_flight[ref] = task
        self.request_ages[ref] = (self.run.net.age, self.weights_age, time.time())

    def _publish(self) -> tuple[list, int]:
        weights, age = self.fleet.publish(self.run.net)
        self.loads.published(age)
        return weights, age

    def next(self) -> Rollout | None:
        """The next batch to learn from; None when the one that arrived was dropped as stale."""
        run, fleet, ray = self.run, self.fleet, self.ray
        if self.owed is not None:
            if run.learner is not None:
                self.weights, self.weights_age = self._publish()
            with run.telemetry.phase("publish"):
                if run.learner is not None:
                    run.weights_handed_out()
                self._submit(self.owed)
            self.owed = None
        while True:
            with run.telemetry.phase("wait"):
                blocked_from = time.time()
                ref, task, fetched = self._take()
                requested_age, handed_age, _ = self.request_ages.pop(ref)
                try:
                    rollout, fetch = fetched.result()
                except ray.exceptions.RayError as exc:
                    self.waits.blocked(blocked_from, time.time())
                    fleet.actor_failed(task, exc)  # resubmitted once its endpoint answers
                    continue
                self.waits.blocked(blocked_from, time.time(), fetch)
                depth = self._prefetch()
            with run.telemetry.phase("bookkeeping"):
                self.waits.arrived(rollout.timings, fetch[0], rollout.actor_counters)
                if self.request_ages:   # requests are kept in the order they were made: the first is the oldest
                    self.waits.forget_before(next(iter(self.request_ages.values()))[2])
                self.accounts.arrived(rollout)
                self.loads.arrived(rollout)
                run.acted(requested_age, rollout, handed_age)
                run.queue(depth, self.capacity)
                if run.net.age - rollout.policy_age > run.cfg.max_staleness:
                    run.drop("stale", rollout.env_steps)
                    self._submit(task[0])
                    # Back to the run loop: when every batch is stale (weights that never reach the
                    # actors) nothing is learned, yet the run must still stop, write rows and raise alerts.
                    return None
            self.owed = task[0]
            return rollout

    def _take(self) -> tuple:
        """(ref, task, future) of the next rollout: the one prefetched, or the earliest-requested to finish."""
        self._restarted_actors()
        if self.prefetched is not None:
            taken, self.prefetched = self.prefetched, None
            return taken
        while True:
            ready, _ = self.ray.wait(list(self.in_flight) + list(self.fleet.pending_endpoints), num_returns=1)
            if ready[0] in self.fleet.pending_endpoints:
                self._endpoint_answered(ready[0])
                continue
            return self._fetch(self._finished(ready[0])[0])

    def _prefetch(self) -> int:
        """Start fetching the earliest-requested finished rollout; how many are finished and not taken."""
        finished = self._finished()
        if finished:
            self.prefetched = self._fetch(finished[0])
        return len(finished)

    def _fetch(self, ref) -> tuple:
        return ref, self.in_flight.pop(ref), self.fetcher.submit(self._get, ref)

    def _get(self, ref) -> tuple[Rollout, tuple[float, float]]:
        """In the fetching thread: the rollout unpacked, and for a CUDA learner staged in pinned memory; when
        (time.time()) that began and ended: a learner blocked meanwhile is paying the cost of taking ready work."""
        started = time.time()
        rollout = pin_rollout(self.ray.get(ref), self.run.device)
        return rollout, (started, time.time())

    def _finished(self, known=None) -> list:
        return finished_in_request_order(self.ray, self.in_flight, known)

    def _restarted_actors(self) -> None:
        """Restarted actors whose endpoint answered get their requests (without blocking: the queue may be full)."""
        pending = list(self.fleet.pending_endpoints)
        if pending:
            for ref in self.ray.wait(pending, num_returns=len(pending), timeout=0)[0]:
                self._endpoint_answered(ref)

    def _endpoint_answered(self, ref) -> None:
        back = self.fleet.endpoint_answered(ref)
        for _ in range(self.per_actor if back is not None else 0):
            self._submit(back)

    def drain(self) -> None:
        """Rollouts that actors finished but the learner never took: counted, not silently lost."""
        refs = list(self.in_flight) + ([self.prefetched[0]] if self.prefetched is not None else [])
        self.prefetched = None
        # Asked behind the requests still pending: once the actors answer, every rollout they will deliver is done.
        self.accounts.final(final_counters(self.ray, self.fleet.actors, DRAIN_SECONDS))
        for samples in self.fleet.finished_samples(refs):
            self.run.left_in_flight(samples)
        for ref in self.ray.wait(refs, num_returns=len(refs), timeout=0)[0] if refs else ():
            with contextlib.suppress(self.ray.exceptions.RayError):
                self.accounts.left_in_flight(self.ray.get(ref))

    def close(self) -> None:
        """Stop the fetching thread (it only ever fetches finished rollouts, so it ends promptly)."""
        self.fetcher.shutdown(wait=True, cancel_futures=True)

    def summary(self) -> dict:
        return _summary(self.run.cfg, self.fleet, self.accounts)


def finished_in_request_order(ray, requested: Iterable, known=None) -> list:
    """The requested rollouts finished now, earliest-requested first (`known`: one known to be finished).

    `requested` iterates in the order the requests were made. Ray does not say which ready object `wait`
    hands back first, and it is not always the oldest: a finished rollout passed over again and again went
    hundreds of learner steps stale and was dropped on a healthy run. Taking the oldest bounds a rollout's
    wait by the requests ahead of it."""
    order = {ref: i for i, ref in enumerate(requested)}
    if not order:
        return []
    ready = ray.wait(list(order), num_returns=len(order), timeout=0)[0]
    return sorted(set(ready) | ({known} if known is not None else set()), key=order.__getitem__)


class DriverStatistics:
    """The `inv_*` statistics the driver measures per update: the actors' accounting, the learner's waits, the
    actors' weight loads."""

    def __init__(self, *sources):
        self.sources = sources

    def take_statistic(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for source in self.sources:
            out.update(source.take_statistic())
        return out


DRAIN_SECONDS = 5.0
"""How long the end of a run waits for the actors' last rollouts and counters."""


def _summary(cfg: TrainConfig, fleet: Fleet, accounts: ActorAccounts) -> dict:
    return {"mode": "ray", "num_actors": fleet.num_actors, "sync": cfg.sync, "actor_restarts": fleet.count_restarts(),
            "samples": {"actors": accounts.summary()}}


def train_ray(cfg: TrainConfig, archive: RunArchive, telemetry=None, stop=None, resume: dict | None = None,
              observers: Iterable[RowObserver] = ()) -> dict:
    """The run on a Ray cluster (joined, or started privately and stopped at the end); the run summary.

    Arguments as for `rlvitals.training.train_local`.
    """
    start_ray(cfg)
    fleet = source = None
    try:
        seed_everything(cfg.seed, cfg.torch_threads)
        obs_space, action_space = env_spaces(cfg)
        run = Run.build(cfg, archive, obs_space, action_space, telemetry, stop, resume, observers)
        fleet = Fleet(cfg, archive, run.telemetry, run_info(cfg, archive))
        source = SyncRollouts(run, fleet) if cfg.sync else AsyncRollouts(run, fleet)
        return run.drive(source)
    finally:
        if isinstance(source, AsyncRollouts):
            source.close()
        if fleet is not None:
            fleet.shutdown()
        stop_ray()
