"""Every rollout and every second of every actor, accounted for by the actor and checked by the driver.

Each actor incarnation (a process Ray started; a restart is a new one) keeps
its own counters (`ActorCounters`): rollouts produced (the runner finished
one), delivered (handed back as the task's result) and dropped by reason, and
its seconds split into phases that add up to its wall time since it started.
A snapshot of them travels on every rollout (`Rollout.actor_counters`).

The driver (`ActorAccounts`) counts what it receives from each incarnation.

inv_actor_accounting (per update, in Ray mode)
    The largest excess, over the rollouts that arrived since the last update,
    of the rollouts the driver received from an incarnation over the rollouts
    that incarnation says it had produced when it delivered the latest of
    them. Derivation: each rollout's snapshot is taken as it is delivered and
    counts it, so a correct pipeline receives at most what was produced; a
    rollout received twice, or credited to the wrong actor, makes the excess
    positive. False alarms: none (exact counts).

At the end of a run (summary.json, samples.actors): per actor, produced =
delivered + dropped, and delivered = received + in flight (finished, never
taken), from the actors' final counters, which are asked for behind their
last requested rollouts, so every rollout they will ever deliver is counted.
An incarnation that died is judged on the last counters it sent.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict, deque

from rlvitals.telemetry.attribution import actor_name
from rlvitals.telemetry.invariants import BY_NAME as INVARIANTS_BY_NAME
from rlvitals.telemetry.memory import memory_in_use

from ..evidence import MemoryGrowth
from .peers import PeerSpeeds

MEMORY_LIMIT = INVARIANTS_BY_NAME["memory_per_sample"].limit
"""Bytes per sample beyond which an incarnation's growth breaks memory_per_sample."""
FINISHED_KEPT = 8
"""Completion stamps of earlier deliveries that travel with each rollout."""
PHASES = ("env_step", "inference", "weight_wait", "work_wait", "other")
"""Where an actor's seconds go (the `phase` values of rlvitals_actor_phase_seconds_total): stepping envs, the
policy's forward pass, waiting for and loading weights, waiting for work (no request in hand: the rollout it
finished waits for the learner to ask for the next), and the rest (start-up, the runner's bookkeeping and
packing, the actor's own telemetry and delivery). They add up to the incarnation's wall time since its
constructor began."""


class ActorCounters:
    """One actor incarnation's own accounting.

    Every second since `born` is in exactly one phase: time before `_mark` is in `seconds`; after it, the
    tail of the last delivery (other) up to `_ready`, then waiting for work until a request arrives."""

    def __init__(self, actor_id: int, pid: int, born: float | None = None):
        """`born`: time.perf_counter() when the actor's constructor began (default: now)."""
        now = time.perf_counter()
        self.actor_id, self.pid = actor_id, pid
        self.produced = self.delivered = 0
        self.samples = 0
        self.sample_bytes = 0.0
        """The largest bytes per sample of a rollout delivered (the memory invariant's unit)."""
        """Env steps in the rollouts delivered: what the incarnation's memory growth is judged against."""
        self.dropped: Counter = Counter()
        self.dropped_steps = 0
        """Env steps (vector steps x envs, as the witness counts them) of the rollouts dropped with a reason."""
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.born = now if born is None else born
        self.born_wall = time.time() - (now - self.born)
        """The same instant on the wall clock, which the phases' perf_counter sums are checked against."""
        self._mark = self.born
        self._ready = now           # start-up (other) ends here; waiting for the first request begins
        self._task: float | None = None
        self.weight_loads = self.versions_loaded = 0
        """Loads into the acting network, and how many of them loaded a version newer than any loaded before."""
        self.newest_loaded = -1
        self.finished: deque = deque(maxlen=FINISHED_KEPT)
        """(delivery number, completion stamp, seconds of work) of the latest rollouts delivered: the driver learns
        from them when work it has not taken was ready (distributed/readiness.py)."""
        self.loaded_since: list[int] = []
        """The versions loaded since the last delivery (they travel with the next rollout delivered)."""

    def stamp(self, rollout, work_s: float) -> None:
        """The rollout goes back now: its completion stamp (time.time()), on it and on the next ones delivered."""
        rollout.timings["finished_at"] = stamp = time.time()
        self.finished.append((self.delivered, stamp, work_s))

    def loaded(self, version: int) -> None:
        """Weights of network age `version` were loaded into the network that acts. The versions an actor is
        handed never go back, so a load that is not newer than every earlier one loads a version again."""
        self.weight_loads += 1
        if version > self.newest_loaded:
            self.versions_loaded += 1
            self.newest_loaded = version
        self.loaded_since.append(version)

    def task_started(self) -> float:
        """A request arrived: the wait for it ends now (returned: now)."""
        self._task = time.perf_counter()
        return self._task

    def produced_one(self) -> None:
        self.produced += 1

    def dropped_one(self, reason: str, rollout=None) -> None:
        """A rollout produced and never delivered, for `reason`; its env steps as its witness counted them."""
        self.dropped[reason] += 1
        self.dropped_steps += sum(rec.steps for rec in getattr(rollout, "witness", ()) or ())

    def phases(self, rollout, weights_s: float) -> None:
        """Put every second since the last call into a phase; the rollout carries this share in `timings`.

        Called once per rollout, before the actor's telemetry exports its timings."""
        now = time.perf_counter()
        timings = rollout.timings
        timings["weight_wait"] = weights_s
        task = self._task if self._task is not None else now
        timings["work_wait"] = max(0.0, task - max(self._ready, self._mark))
        known = sum(timings.get(p, 0.0) for p in ("env_step", "inference", "weight_wait", "work_wait"))
        timings["other"] = max(0.0, now - self._mark - known)
        for phase in PHASES:
            self.seconds[phase] += timings.get(phase, 0.0)
        self._mark = now

    def deliver(self, rollout) -> None:
        """`rollout` goes back to the driver now: count it, stamp the counters on it."""
        self.delivered += 1
        self.samples += rollout.env_steps
        self.sample_bytes = max(self.sample_bytes, rollout.bytes_per_sample)
        rollout.actor_counters = (self.snapshot(),)
        self.loaded_since = []
        self._task = None
        self._ready = time.perf_counter()

    def snapshot(self) -> dict:
        """The counters now, with the seconds since the last `phases` call in theirs (`wall`: the wall clock's
        seconds since `born`, which the phases add up to)."""
        now = time.perf_counter()
        seconds = dict(self.seconds)
        if self._task is not None or self._ready < self._mark:   # inside a task: its tail so far
            seconds["other"] += now - self._mark
        else:
            seconds["other"] += self._ready - self._mark
            seconds["work_wait"] += now - self._ready
        return {"actor": self.actor_id, "pid": self.pid, "produced": self.produced, "delivered": self.delivered,
                "dropped": dict(self.dropped), "dropped_steps": self.dropped_steps, "seconds": seconds,
                "wall": time.time() - self.born_wall, "samples": self.samples, "memory": memory_in_use(),
                "sample_bytes": self.sample_bytes,
                "weight_loads": self.weight_loads, "versions_loaded": self.versions_loaded,
                "loaded_versions": tuple(self.loaded_since), "finished": tuple(self.finished)}


class ActorAccounts:
    """The driver's side: rollouts received and left in flight per actor incarnation, against its counters."""

    def __init__(self):
        self.received: Counter = Counter()
        self.in_flight: Counter = Counter()
        self.latest: dict[tuple[int, int], dict] = {}
        """(actor, pid) -> the newest counters that incarnation sent."""
        self._excess: float | None = None
        self.memory: defaultdict[tuple[int, int], MemoryGrowth] = defaultdict(MemoryGrowth)
        self._memory_per_sample: tuple[float, tuple[int, int]] | None = None
        self.growth: dict[tuple[int, int], float] = {}
        """Each incarnation's latest memory growth per sample (where it has enough points)."""
        """The largest memory growth per sample since the last take, and whose."""
        self.peers = PeerSpeeds()

    def _note(self, counters: dict) -> tuple[int, int]:
        key = (int(counters["actor"]), int(counters["pid"]))
        if counters["produced"] >= self.latest.get(key, {}).get("produced", -1):
            self.latest[key] = counters
        return key

    def arrived(self, rollout) -> None:
        """A rollout the driver took from the queue (learned from or dropped: it was received)."""
        for counters in rollout.actor_counters:
            key = self._note(counters)
            self.received[key] += 1
            self.peers.arrived(key, counters)
            excess = max(0, self.received[key] - int(counters["produced"]))
            self._excess = excess if self._excess is None else max(self._excess, excess)
            if "memory" in counters:
                growth = self.memory[key].add(counters["samples"], counters["memory"],
                                              counters.get("sample_bytes", 0.0))
                if growth == growth:        # not NaN: the incarnation has enough points
                    self.growth[key] = growth
                    if self._memory_per_sample is None or growth > self._memory_per_sample[0]:
                        self._memory_per_sample = (growth, key)   # the worst since the last take

    def left_in_flight(self, rollout) -> None:
        for counters in rollout.actor_counters:
            self.in_flight[self._note(counters)] += 1

    def final(self, snapshots: list[dict]) -> None:
        """The actors' counters at the end of the run."""
        for counters in snapshots:
            self._note(counters)

    def take_statistic(self) -> dict:
        """inv_actor_accounting over the arrivals since the last call; the worst actor incarnation's memory
        growth per sample it produced (`actors_memory_per_sample`, which the run folds into
        inv_memory_per_sample) and whose it is (`actors_memory_named`); and the actors far slower than their
        peers (`actors_slow`, `actors_slow_named`: rlvitals/distributed/peers.py; `actors_slow` is always there,
        0 while too few actors can be judged)."""
        out = self.peers.take_statistic()
        if self._excess is not None:
            out["inv_actor_accounting"], self._excess = float(self._excess), None
        if self._memory_per_sample is not None:
            growth, (actor, pid) = self._memory_per_sample
            out["actors_memory_per_sample"] = float(growth)
            named = f"{actor_name(actor, pid)}: {growth:.4g} samples' worth kept per sample it produced"
            # One actor or all of them: how many others also grow beyond the invariant's limit.
            others = sum(g > MEMORY_LIMIT for k, g in self.growth.items() if k != (actor, pid))
            if others:
                named += f"; {others} of the other {len(self.growth) - 1} measured actors also over {MEMORY_LIMIT:g}"
            out["actors_memory_named"] = named
            self._memory_per_sample = None
        return out

    def summary(self) -> dict:
        """Per actor (incarnations summed) and in all: the actors' counts, the driver's, and the mismatch."""
        per_actor: dict[int, dict] = {}
        for (actor, pid), c in sorted(self.latest.items()):
            row = per_actor.setdefault(actor, {"incarnations": 0, "produced": 0, "delivered": 0, "dropped": {},
                                               "received": 0, "in_flight": 0, "seconds": dict.fromkeys(PHASES, 0.0),
                                               "wall": 0.0})
            row["incarnations"] += 1
            row["produced"] += c["produced"]
            row["delivered"] += c["delivered"]
            for reason, n in c["dropped"].items():
                row["dropped"][reason] = row["dropped"].get(reason, 0) + n
            row["received"] += self.received[(actor, pid)]
            row["in_flight"] += self.in_flight[(actor, pid)]
            row["wall"] = round(row["wall"] + c.get("wall", 0.0), 3)
            for phase, s in c["seconds"].items():
                row["seconds"][phase] = round(row["seconds"].get(phase, 0.0) + s, 3)
        mismatch = 0
        for row in per_actor.values():
            row["mismatch"] = (abs(row["produced"] - row["delivered"] - sum(row["dropped"].values()))
                               + abs(row["delivered"] - row["received"] - row["in_flight"]))
            mismatch += row["mismatch"]
        return {"per_actor": {str(a): row for a, row in per_actor.items()}, "mismatch": mismatch}


def final_counters(ray, actors: list, timeout: float) -> list[dict]:
    """Each actor's counters, asked behind the rollouts already requested from it (an actor runs its calls in
    order), so they count every rollout it will deliver; actors that do not answer within `timeout` are left out."""
    refs = [actor.counters.remote() for actor in actors]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    out = []
    for ref in ready:
        try:
            out.append(ray.get(ref))
        except ray.exceptions.RayError:
            continue
    return out
