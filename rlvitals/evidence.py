"""The pipeline family of invariants, measured by the run itself in evidence (arrivals, updates, samples).

`PipelineEvidence` sees every batch that arrives (learned from or dropped) and
gives, per arrival, the `inv_*` statistics of the invariants the run's own
counters can judge (telemetry/invariants.py has their limits and derivations):

- `inv_samples_dropped`: the share of samples dropped as stale over the last
  `DROP_WINDOW` arrivals;
- `inv_weights_frozen`: learner updates (that stepped the network) since the
  newest network age seen in an arriving batch last advanced, beyond what the
  queues can explain;
- `inv_memory_per_sample`: memory in use (telemetry.memory) gained per sample
  processed over the later half of the run so far, when both its quarters grow,
  in samples' worth: over the bytes one sample of the process's own rollouts
  takes (`MemoryGrowth`; Ray mode judges each actor incarnation on the samples it
  produced the same way, and the row holds the worst process);
- `inv_rollouts_retained`: rollouts alive in this process beyond what queues and
  the batch in hand can hold.

`HandedWeights` sees every rollout as it arrives, with the learner's network
age when it was requested, and gives `inv_weights_current_at_request`: how many
learner steps older the network that acted was (0 in a correct run); in Ray mode it
also names the actors that acted with older weights than they were handed.

`WitnessedSteps` sees every rollout as it arrives, with the env steps its witness
counted at the lowest level since it was built, and gives
`inv_env_steps_accounted`: the env steps counted there that neither arrived nor
were dropped by the actor with a reason (0 in a correct run); in Ray mode it
also names the actor processes whose steps went missing.

`WeightLoads` sees every rollout as it arrives, with the weight loads its actor
counted at the network (cumulative, since the incarnation started) and the
versions the driver published, and gives `inv_weight_loads_per_published_version`:
loads of a version already loaded, loads of a version never published, and
rollouts acted by a version never published (0 in a correct run), naming the actors.

Nothing here reads the clock: a fast and a slow machine see the same statistics
after the same batches.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections import deque
from types import SimpleNamespace

from rlvitals.telemetry.attribution import actor_name, who_broke

DROP_WINDOW = 16
"""Arrivals over which the share of dropped samples is taken."""

MEMORY_POINTS = 256
"""(samples, bytes in use) points kept; thinned by halves so they span the whole run."""
MEMORY_MIN_GROWTH = 8 * 2 ** 20
"""Growth over the judged window below which memory is not judged: allocator noise, caches filling (healthy runs
gain under 1 MiB there; a CartPole actor keeping every rollout gains 14 MiB in the later half of 500k steps)."""
MEMORY_MIN_POINTS = 32

ORDER_SLACK = 1024
"""Records of one witness kept waiting for an earlier delivery at most (beyond them, not judged)."""

ROLLOUT_SLACK = 4
"""Rollouts a correct learner may hold beyond its queue: the batch in hand, one arriving, a concat's parts."""

NAN = float("nan")


class PipelineEvidence:
    def __init__(self):
        self.arrivals: deque = deque(maxlen=DROP_WINDOW)   # (samples, dropped samples) per arrival
        self.newest_age: int | None = None
        self.steps_since_newer = 0
        self.memory = MemoryGrowth()
        self.samples = 0.0

    # ------------------------------------------------------------- what the run tells it
    def dropped(self, samples: int) -> dict[str, float]:
        self.arrivals.append((samples, samples))
        return {"inv_samples_dropped": self._drop_share()}

    def learned(self, samples: int, policy_age: int, stepped: bool, capacity: int | None, memory: float,
                rollouts_alive: float | None, sample_bytes: float = 0.0) -> dict[str, float]:
        """One batch learned from: `stepped` when the update moved the network (not skipped as non-finite);
        `memory`: the learner process's bytes in use now (telemetry.memory.memory_in_use); `sample_bytes`: the
        bytes one of the batch's samples takes (Rollout.bytes_per_sample)."""
        self.arrivals.append((samples, 0))
        self.samples += samples
        out = {"inv_samples_dropped": self._drop_share(), "inv_weights_frozen": NAN,
               "inv_memory_per_sample": self.memory.add(self.samples, memory, sample_bytes),
               "inv_rollouts_retained": NAN,
               "inv_run_without_updates": 0.0}   # judged for the whole run when it ends
        bound = (capacity or 1) + 1
        if self.newest_age is None or policy_age > self.newest_age:
            self.newest_age, self.steps_since_newer = policy_age, 0
        elif stepped:
            self.steps_since_newer += 1
        if capacity is not None:
            out["inv_weights_frozen"] = float(max(0, self.steps_since_newer - bound))
            if rollouts_alive is not None:
                out["inv_rollouts_retained"] = float(max(0.0, rollouts_alive - capacity - ROLLOUT_SLACK))
        return out

    # ------------------------------------------------------------- statistics
    def _drop_share(self) -> float:
        total = sum(s for s, _ in self.arrivals)
        return sum(d for _, d in self.arrivals) / total if total else NAN


def count_producer(tally: dict[str, list[int]], worst: dict[str, int], producer: str, amount: int) -> None:
    """One arrival from `producer` into `tally` ([arrivals over the limit of 0, arrivals]) and its worst amount."""
    counts = tally.setdefault(producer, [0, 0])
    counts[0] += amount > 0
    counts[1] += 1
    if amount:
        worst[producer] = max(worst.get(producer, 0), amount)


class HandedWeights:
    """Per arriving rollout: the learner's network age when it was requested against the age that acted.

    Every request carries the learner's network as it is when the request is made (Ray: published after every
    update, handed with each request; local: the learner's own network acts), and an actor loads what it is
    handed before it steps. So the age stamped on a rollout equals the learner's age at its request. A gap has
    two places it can come from, told apart so the text names the right one: the weights handed with the
    request were older than the learner's network (the driver's publication), or the actor acted with older
    weights than it was handed (that actor's load)."""

    def __init__(self):
        self._lag: float | None = None
        self.tally: dict[str, list[int]] = {}
        """Producer (Ray actor incarnation) -> [rollouts acted with older weights than handed, rollouts arrived]."""
        self.worst: dict[str, int] = {}
        """Producer -> the most learner steps it acted behind what it was handed."""
        self.handed_old = [0, 0, 0]
        """[requests handed older weights than the learner's network, requests, the most steps older]."""

    def arrived(self, requested_age: int, policy_age: int, producer: str = "", handed_age: int | None = None) -> None:
        """A rollout requested when the learner's network was `requested_age`, handed the weights of `handed_age`
        (default: the same), acted by `policy_age`."""
        handed = requested_age if handed_age is None else handed_age
        lag = max(0, requested_age - policy_age)
        self._lag = lag if self._lag is None else max(self._lag, lag)
        published_lag, load_lag = max(0, requested_age - handed), max(0, handed - policy_age)
        self.handed_old[0] += published_lag > 0
        self.handed_old[1] += 1
        self.handed_old[2] = max(self.handed_old[2], published_lag)
        if producer:
            count_producer(self.tally, self.worst, producer, load_lag)

    def take_statistic(self) -> dict:
        """The largest lag (learner steps) over the rollouts since the last take; once any lagged, where: the
        publication, the actors that did not load what they were handed, or both."""
        out: dict = {}
        if self._lag is not None:
            out["inv_weights_current_at_request"], self._lag = float(self._lag), None
        where = []
        old, requests, most = self.handed_old
        if old:
            where.append(f"the learner's publication: {old} of {requests} requests were handed weights older than "
                         f"the learner's network (up to {most} learner steps)")
        if self.worst:
            notes = {p: f" (acted up to {n} learner steps behind the weights it was handed)"
                     for p, n in self.worst.items()}
            where.append(who_broke(self.tally, "rollouts", notes))
        if where:
            out["weights_current_at_request_named"] = "; ".join(where)
        return out


class WitnessedSteps:
    """Per witness (one runner: the local one, or a Ray actor incarnation's), the env steps it counted since it was
    built against those of its records that arrived and those its actor dropped with a reason.

    Every env step is in exactly one witness record, and a record travels with its rollout, so when a record
    arrives, the steps counted up to it are those of the records that arrived before it and with it, plus those
    of rollouts dropped with a reason (counted by the actor, reported on its next rollout), plus those of records
    still in flight. Nothing is in flight ahead of an arriving record: a runner collects one rollout at a time and
    the driver takes each actor's finished rollouts earliest-requested first. So the difference is 0 in a correct
    run; an actor that collects a rollout and drops or keeps it without counting it (its own counters agree with
    themselves) shows a difference of that rollout's steps on its next delivery.

    The order the driver takes rollouts in is the consumer's, not the actor's: a record that arrives ahead of one
    its actor delivered before it (the actor's `delivered` count says which) waits until those have arrived, so a
    learner loop that takes rollouts out of order is not blamed on the actor."""

    def __init__(self):
        self.received: dict[int, int] = {}
        """Witness origin -> env steps of its records that arrived."""
        self.waiting: dict[int, dict[int, tuple]] = {}
        """Witness origin -> {its actor's delivery number: (record, dropped steps, producer)} arrived ahead of order."""
        self.next_delivery: dict[int, int] = {}
        self._gap: int | None = None
        self.tally: dict[str, list[int]] = {}
        """Producer (Ray actor incarnation) -> [arrivals with steps unaccounted for, arrivals]."""
        self.worst: dict[str, int] = {}

    def arrived(self, rollout, producer: str = "") -> None:
        """One runner's rollout arrived (before any joining), learned from or about to be dropped as stale."""
        records = [r for r in getattr(rollout, "witness", ()) or () if r.steps_total >= 0]
        if len(records) != 1:
            return   # unwitnessed, or joined already: not one runner's evidence
        rec = records[0]
        counters = getattr(rollout, "actor_counters", ()) or ()
        dropped = sum(int(c.get("dropped_steps", 0)) for c in counters)
        delivered = [int(c["delivered"]) for c in counters if "delivered" in c]
        if len(delivered) != 1:
            self._judge(rec, dropped, producer)
            return
        number, waiting = delivered[0], self.waiting.setdefault(rec.origin, {})
        expected = self.next_delivery.get(rec.origin, 1)   # an incarnation's first delivery is its 1st
        if number < expected:       # an earlier one, or an actor that numbers nothing: judged as it comes
            self._judge(rec, dropped, producer)
            return
        # Records ahead of one still in flight wait for it however long: it is not lost, the learner has not taken
        # it (a loop that hoards finished work is judged by learner_waits_while_ready, not blamed on the actor).
        if len(waiting) < ORDER_SLACK:
            waiting[number] = (SimpleNamespace(origin=rec.origin, steps=rec.steps, steps_total=rec.steps_total),
                               dropped, producer)
        while expected in waiting:
            self._judge(*waiting.pop(expected))
            expected += 1
        self.next_delivery[rec.origin] = expected

    def _judge(self, rec, dropped: int, producer: str) -> None:
        self.received[rec.origin] = self.received.get(rec.origin, 0) + rec.steps
        gap = abs(rec.steps_total - self.received[rec.origin] - dropped)
        self._gap = gap if self._gap is None else max(self._gap, gap)
        if producer:
            count_producer(self.tally, self.worst, producer, gap)

    def take_statistic(self) -> dict:
        """The largest difference (env steps) over the arrivals since the last take; once any differed in Ray
        mode, the actor processes it was seen in (`env_steps_accounted_named`)."""
        out: dict = {}
        if self._gap is not None:
            out["inv_env_steps_accounted"], self._gap = float(self._gap), None
        if self.worst:
            notes = {p: f" (up to {n} env steps it took neither delivered nor dropped with a reason)"
                     for p, n in self.worst.items()}
            out["env_steps_accounted_named"] = who_broke(self.tally, "rollouts", notes)
        return out


class WeightLoads:
    """Per arriving rollout: the weight loads its actor incarnation counted, against the versions the driver published.

    The driver publishes the learner's network under its age and hands the newest publication with each request; the
    versions one actor is handed never go back. A correct actor loads a version the first time it is handed it and
    acts with what it loaded. So each incarnation loads every version at most once (its loads equal the distinct
    versions it loaded), loads only published versions, and every rollout's network age was published. The actor
    counts its loads at the network itself (a load-state hook: whoever loads, it is counted) and stamps the counts on
    every rollout it delivers (distributed/accounting.py); the driver checks them against its publications."""

    def __init__(self):
        self.ages = array("q")
        """Network ages published, ascending (a long run publishes one per update: 8 bytes each)."""
        self.repeats: dict[str, int] = {}
        """Producer -> the loads of an already loaded version its counters showed last."""
        self._excess: int | None = None
        self.tally: dict[str, list[int]] = {}
        """Producer -> [rollouts whose counters show a load or an action out of order, rollouts arrived]."""
        self.worst: dict[str, int] = {}
        self.kinds: dict[str, set[str]] = {}

    def published(self, age: int) -> None:
        """The driver published the learner's network of this age for the actors."""
        if not self.ages or age > self.ages[-1]:
            self.ages.append(age)
        elif not self.was_published(age):    # never in a run (ages only grow), kept correct all the same
            self.ages.insert(bisect_left(self.ages, age), age)

    def was_published(self, age: int) -> bool:
        i = bisect_left(self.ages, age)
        return i < len(self.ages) and self.ages[i] == age

    def arrived(self, rollout) -> None:
        """An actor's rollout arrived (before any joining), learned from or about to be dropped."""
        for counters in getattr(rollout, "actor_counters", ()) or ():
            if "weight_loads" not in counters:
                continue
            producer = actor_name(counters["actor"], counters["pid"])
            repeats = int(counters["weight_loads"]) - int(counters["versions_loaded"])
            again = max(0, repeats - self.repeats.get(producer, 0))   # cumulative: new ones since the last seen
            self.repeats[producer] = max(repeats, self.repeats.get(producer, 0))
            unpublished = sum(not self.was_published(int(v)) for v in counters.get("loaded_versions", ()))
            acted = 0 if self.was_published(int(rollout.policy_age)) else 1
            kinds = self.kinds.setdefault(producer, set())
            for kind, n in (("loaded a version again", again), ("loaded a version never published", unpublished),
                            ("acted with a version never published", acted)):
                if n:
                    kinds.add(kind)
            amount = again + unpublished + acted
            self._excess = amount if self._excess is None else max(self._excess, amount)
            count_producer(self.tally, self.worst, producer, amount)

    def take_statistic(self) -> dict:
        """The most out-of-order loads and actions one arrival showed since the last take; once any, who."""
        out: dict = {}
        if self._excess is not None:
            out["inv_weight_loads_per_published_version"], self._excess = float(self._excess), None
        if self.worst:
            notes = {p: f" ({', '.join(sorted(self.kinds[p]))})" for p in self.worst}
            out["weight_loads_per_published_version_named"] = who_broke(self.tally, "rollouts", notes)
        return out


class MemoryGrowth:
    """One process's memory judged against the samples it processed (the learner's learned, an actor's produced)."""

    def __init__(self):
        self.points: list[tuple[float, float]] = []
        self.stride = 1
        self.seen = 0
        self.sample_bytes = 0.0
        """The largest size of one of the process's samples seen (bytes): the statistic's unit."""

    def add(self, samples: float, memory: float, sample_bytes: float) -> float:
        """Samples' worth of memory gained per sample over the later half of the process's points so far (bytes
        per sample over `sample_bytes`, one sample's size), if both quarters of it grew and by MEMORY_MIN_GROWTH in
        all; else 0; NaN until MEMORY_MIN_POINTS points or without a sample size."""
        self.seen += 1
        self.sample_bytes = max(self.sample_bytes, float(sample_bytes))
        if self.seen % self.stride == 0:
            self.points.append((float(samples), float(memory)))
            if len(self.points) >= MEMORY_POINTS:
                self.points = self.points[::2]
                self.stride *= 2
        if len(self.points) < MEMORY_MIN_POINTS:
            return NAN
        half = self.points[len(self.points) // 2:]
        (s0, r0), (s1, r1), (s2, r2) = half[0], half[len(half) // 2], half[-1]
        if r2 - r0 < MEMORY_MIN_GROWTH or r1 <= r0 or r2 <= r1 or s2 <= s0:
            return 0.0
        per_sample = min((r1 - r0) / max(s1 - s0, 1.0), (r2 - r1) / max(s2 - s1, 1.0))
        kept = per_sample / self.sample_bytes if self.sample_bytes > 0 else NAN
        return kept if math.isfinite(kept) else NAN
