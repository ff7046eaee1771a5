"""The invariant monitor: counts, update by update, how long each invariant has been over its limit."""

from __future__ import annotations

from .invariants import INVARIANTS


class InvariantMonitor:
    """Counts, update by update, how long each invariant's statistic has been over its limit; latches breaks.

    Evidence about one batch's producers (`per_batch` invariants, in a Ray run) is also counted per producer:
    one faulty actor among eight delivers one batch in eight, and its breaks are in a row among its own
    batches only, so the run-wide streak is reset by its healthy peers' batches and never reaches the hold.
    A fault in every actor still breaks the run-wide streak after `hold_updates` updates.
    """

    def __init__(self, invariants=INVARIANTS):
        self.invariants = tuple(invariants)
        self.streaks: dict[str, dict[str, int]] = {i.name: {} for i in self.invariants}
        """Invariant -> producer ('' for the run as a whole) -> its current streak."""
        self.broken_at: dict[str, int] = {}
        """Invariant -> the update at which it first counted as broken."""

    def observe(self, stats: dict, update: int, producers: tuple[str, ...] | list[str] = ()) -> dict[str, float]:
        """Judge one update's statistics, whose batch `producers` made (Ray actors; empty: not told apart);
        the `inv_broken_*` keys to record with them."""
        for inv in self.invariants:
            over = inv.over(stats, update)
            if over is None:
                continue   # not measured this update: the streak neither grows nor resets
            streaks = self.streaks[inv.name]
            # Run-wide, and per producer where the evidence is one batch's: a fault in every actor breaks the
            # run-wide streak as fast as ever, a fault in one actor breaks that actor's own.
            for producer in ("", *producers) if inv.per_batch else ("",):
                streaks[producer] = streaks.get(producer, 0) + 1 if over else 0
            if max(streaks.values()) >= inv.hold_updates and inv.name not in self.broken_at:
                self.broken_at[inv.name] = update
        return {inv.broken_key: float(self.broken_at.get(inv.name, 0)) for inv in self.invariants}

    def state(self) -> dict:
        """Each invariant's longest current streak (over producers) and the breaks."""
        return {"streak": {name: max(s.values(), default=0) for name, s in self.streaks.items()},
                "broken_at": dict(self.broken_at)}

    def load_state(self, state: dict) -> None:
        """Streaks go on run-wide (a resumed run's actors are new processes); breaks stay."""
        for k, v in state.get("streak", {}).items():
            if k in self.streaks:
                self.streaks[k] = {"": int(v)}
        self.broken_at.update({k: int(v) for k, v in state.get("broken_at", {}).items() if k in self.streaks})
