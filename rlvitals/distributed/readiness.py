"""Was the learner idle while work was ready? Judged from the producers' completion stamps (Ray's async loop).

inv_learner_waits_while_ready (per update)
    Each Ray rollout worker stamps the wall-clock time at which it finished a
    rollout (`timings["finished_at"]`, time.time(), made by the producer just
    before it hands the rollout back), so the evidence does not come from the
    consumer's own view of what is ready. The driver records every interval in
    which the learner was blocked waiting for its next batch. For every
    rollout that arrives, the blocked time after its completion stamp (plus
    CLOCK_SKEW_S, and TRAVEL_SHARE of its own work in the actor for its
    travel back) and before its fetch began is time the learner sat idle while
    that work was ready; while the batch it takes is fetched (ray.get and
    unpacking: the cost of taking ready work), a blocked learner is busy,
    whatever else is ready. The union of those stretches (a second counts once,
    however many ready rollouts it kept waiting), as a share of the learner's
    loop since the previous update, is the statistic: a share, so a slow and a
    fast machine read the same. Not measured without stamped arrivals (local
    mode collects its own rollouts; synchronous Ray mode waits for every actor
    by design).
"""

from __future__ import annotations

import time
from collections import deque

STATISTIC = "inv_learner_waits_while_ready"

CLOCK_SKEW_S = 0.005
"""Seconds a producer's wall clock may run behind the driver's: a stamp made on another host is trusted only this
much later than it says. Hosts synced by NTP on one network agree within a millisecond; on one host the clocks are
the same. A clock further behind makes ready work look ready earlier (a larger statistic); one ahead, later."""

TRAVEL_SHARE = 0.25
"""A finished rollout travels back before any loop can take it (the actor's return, serialisation, the object
store, Ray's notice to the driver): it counts as ready only after this share of its own work in the actor. Travel
measured 1-2% of it (10-20 ms against 0.2-1.4 s per rollout, 4 actors on a loaded 2-core machine); both are the
same processes' work on the same machine, so the allowance scales with the machine's speed and load."""
WORK_PHASES = ("env_step", "inference", "weight_wait", "other")
"""The phases of a rollout's timings that are its actor's work on it (distributed/accounting.py)."""

KEPT_BLOCKS = 4096
"""Blocked intervals kept at most (older ones are pruned by the requests still in flight long before this)."""


def covered_length(segments: list[list[float]], start: float, end: float) -> float:
    """Add [start, end] to the sorted, disjoint `segments` (merged in place); the length newly covered."""
    if end <= start:
        return 0.0
    before = sum(b - a for a, b in segments)
    merged: list[list[float]] = []
    for a, b in sorted([*segments, [start, end]]):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    segments[:] = merged
    return sum(b - a for a, b in merged) - before


class ReadyWaits:
    """The driver's record of the learner's blocked intervals, against the stamps of the rollouts that arrive."""

    def __init__(self, skew_s: float = CLOCK_SKEW_S):
        self.skew_s = skew_s
        self.blocks: deque = deque(maxlen=KEPT_BLOCKS)
        """(start, end, segments of it already counted as idle while ready), oldest first."""
        self.untaken: dict[tuple, float] = {}
        """(actor, pid, delivery number) -> when it was ready: delivered by its actor, not yet taken by the learner."""
        self.arrived_number: dict[tuple, int] = {}
        self._loop_start: float | None = None
        self._idle = 0.0
        self._measured = False

    def blocked(self, start: float, end: float, fetched: tuple[float, float] | None = None) -> None:
        """The learner was blocked waiting for its next batch from `start` to `end` (time.time()); `fetched`: when the
        fetch of the batch it took began and ended: while it lasted the learner was busy taking it, whatever else was
        ready."""
        if self._loop_start is None:
            self._loop_start = start
        fetch_start, fetch_end = fetched if fetched is not None else (end, end)
        for a, b in ((start, min(end, fetch_start)), (max(start, fetch_end), end)):
            if b > a:
                self.blocks.append((a, b, []))

    def arrived(self, timings: dict, fetch_started: float, counters: tuple = ()) -> None:
        """A rollout with these `timings` (its producer's completion stamp and phases) and `counters` (its actor's:
        the stamps of the rollouts it delivered before) arrived; its fetch began at `fetch_started`."""
        for c in counters:
            key = (c.get("actor"), c.get("pid"))
            for number, finished_at, work_s in c.get("finished", ()):
                if number > self.arrived_number.get(key, 0):   # delivered before this one, not taken yet
                    self.untaken.setdefault((*key, number), finished_at + self.skew_s + TRAVEL_SHARE * work_s)
            number = int(c.get("delivered", 0))
            self.untaken.pop((*key, number), None)
            self.arrived_number[key] = max(number, self.arrived_number.get(key, 0))
        finished_at = timings.get("finished_at")
        if finished_at is None:
            return
        self._measured = True
        ready = finished_at + self.skew_s + TRAVEL_SHARE * sum(timings.get(p, 0.0) for p in WORK_PHASES)
        self._count(ready, fetch_started)

    def _count(self, ready: float, until: float) -> None:
        for start, end, segments in self.blocks:
            if end > ready and start < until:
                self._idle += covered_length(segments, max(start, ready), min(end, until))

    def forget_before(self, oldest_request: float) -> None:
        """No rollout requested at or after `oldest_request` can have finished before it: older blocks are done."""
        while self.blocks and self.blocks[0][1] < oldest_request - self.skew_s:
            self.blocks.popleft()

    def take_statistic(self) -> dict[str, float]:
        """The idle-while-ready share of the loop since the last call; {} when no stamped rollout arrived."""
        now = time.time()
        for ready in self.untaken.values():   # still waiting to be taken: every block so far after it counts
            self._count(ready, now)
            self._measured = True
        if not self._measured or self._loop_start is None:
            return {}
        loop, self._loop_start = now - self._loop_start, now
        value, self._idle, self._measured = (self._idle / loop if loop > 0 else 0.0), 0.0, False
        return {STATISTIC: value}
