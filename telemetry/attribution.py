"""Which processes' batches break an invariant: a Ray run's verdict names the actors behind its evidence.

The sampling and boundary invariants judged per batch (`Invariant.per_batch`)
read one batch's data alone: the actions, log-probabilities, rewards, episode ends and
observations one or more actor incarnations produced, against the behaviour
they recorded and the env's raw output they witnessed. So each measured batch
is evidence about its producers. Per invariant and producer, this counts the
measured batches and those over the limit; once any batch broke it, the row
carries `<invariant>_named`, which the invariant's verdict quotes:
- some producers: the NAMED with the most broken batches first, each with its
  count, and how the others fared ("actor 3 (pid 812): 6 of 6 measured
  batches over the limit; the other 7 actors: 0 of 41"): the fault is in
  those actors (their node, their env's version, their weights);
- every producer: one line saying so: the fault is in the code all of them run.
An async batch is one incarnation's rollout; a synchronous one joins every
actor's, so its evidence names all of them alike. Local runs have no producers
to tell apart and get no text. Limits and warm-ups are the invariants' own, so
a batch counts as over the limit exactly when its statistic would break a
streak of the monitor (`Invariant.over`, telemetry/invariants.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .invariants import INVARIANTS, Invariant

NAMED = 5
"""Producers a text names at most (how many broke it is always said)."""


class InvariantAttribution:
    """Per attributed invariant and producer: (batches over the limit, batches measured)."""

    def __init__(self, invariants: Iterable[Invariant] = INVARIANTS):
        self.invariants = [i for i in invariants if i.per_batch]
        self.tally: dict[str, dict[str, list[int]]] = {i.name: {} for i in self.invariants}
        self.broken: dict[str, Invariant] = {}
        """The invariants some batch broke, in the order they first did."""

    def observe(self, producers: Sequence[str], stats: dict, update: int) -> dict[str, str]:
        """Count one batch's measured statistics for its `producers`; the texts of every invariant some
        batch broke so far (`<invariant>_named` keys), for the row."""
        if not producers:
            return {}
        for inv in self.invariants:
            over = inv.over(stats, update)
            if over is None:
                continue    # not measured on this batch: no evidence either way
            tally = self.tally[inv.name]
            for producer in producers:
                counts = tally.setdefault(producer, [0, 0])
                counts[0] += over
                counts[1] += 1
            if over:
                self.broken.setdefault(inv.name, inv)
        return {inv.names_key: self.text(inv.name) for inv in self.broken.values()}

    def text(self, name: str) -> str:
        """Who broke invariant `name`: the producers over its limit, worst first, and the rest in one count."""
        return who_broke(self.tally[name], "measured batches")


def who_broke(tally: dict[str, list[int]], unit: str, notes: dict[str, str] | None = None) -> str:
    """Producers with counts [over the limit, measured] (`unit`: what was counted): those over, worst first
    (the NAMED worst, each with its note, if any), the rest in one count; one line when every producer is over."""
    notes = notes or {}
    guilty = sorted(((b, m, p) for p, (b, m) in tally.items() if b), key=lambda x: (-x[0], x[2]))
    if len(guilty) == len(tally) and len(tally) > 1:
        over, measured = sum(b for b, _, _ in guilty), sum(m for _, m, _ in guilty)
        return f"every one of the {len(tally)} actors: {over} of {measured} {unit} over the limit"
    parts = [f"{p}: {b} of {m} {unit} over the limit{notes.get(p, '')}" for b, m, p in guilty[:NAMED]]
    if len(guilty) > NAMED:
        parts.append(f"{len(guilty) - NAMED} more actors over it")
    rest = [m for p, (b, m) in tally.items() if not b]
    if rest:
        parts.append(f"the other {len(rest)} actor{'s' if len(rest) > 1 else ''}: 0 of {sum(rest)}")
    return "; ".join(parts)


def actor_name(actor: int, pid: int) -> str:
    """How every verdict names an actor incarnation: its index in the fleet and its process id."""
    return f"actor {actor} (pid {pid})"


def producers(rollout) -> list[str]:
    """The actor incarnations whose rollouts a batch joins (from the counters stamped on them); [] locally."""
    return [actor_name(c["actor"], c["pid"]) for c in getattr(rollout, "actor_counters", ()) or ()]
