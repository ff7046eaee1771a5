"""What an invariant is: its fields, its families, and how one update's statistic is judged against its limit.

The invariants themselves are data in modules by the part whose data they read
(invariants_actor.py, invariants_learner.py, invariants_pipeline.py, invariants_recurrent.py,
invariants_resume.py); telemetry/invariants.py puts them in
one list, and invariant_monitor.py counts their streaks through a run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ATTRIBUTED_FAMILIES = ("sampling", "boundary", "state")
"""Families judged on one batch's data: in a Ray run, each actor's batches are judged apart, and the actors
whose batches break one are named (telemetry/attribution.py)."""
ACROSS_BATCHES = ("streams_independent",)
"""Of those, the invariants judged on the whole run's data (every stream's resets), not on one batch."""
NAMED_PROCESS = ("memory_per_sample", "weights_current_at_request", "env_steps_accounted",
                 "weight_loads_per_published_version")
"""Invariants judged on each process's own evidence outside a batch's data: the run names the processes."""

FAMILIES = {
    "sampling": "the actions in a batch are draws from the behaviour distribution the actor recorded for them, "
                "and every env draws its own episodes",
    "boundary": "what the learner trains on is what the env emitted, under the declared rules",
    "state": "a recurrent actor's state is stored, carried and reset as its episodes say",
    "dataflow": "the loss's inputs and gradients equal an independent recomputation from the rollout",
    "optimisation": "every parameter that gets a gradient is stepped, and no loss term starves the others",
    "telemetry": "every exported diagnostic agrees with an independent slow recomputation",
    "pipeline": "every sample and second of every process is accounted for",
    "resume": "a resumed run starts from exactly the state its checkpoint was saved from",
}

# The z-score beyond which a sum of martingale differences counts as broken: a two-sided normal tail of
# 2e-9 per measured update, so with 3 updates in a row needed, below 1e-20 per update for a correct run.
Z_LIMIT = 6.0


@dataclass(frozen=True)
class Invariant:
    name: str
    """snake_case; the `invariant` label value and the suffix of its row keys."""
    family: str
    component: str
    """The part that owns the property (telemetry.verdicts.COMPONENTS)."""
    limit: float
    """Broken when the statistic exceeds this."""
    hold_updates: int
    """Measured updates in a row over the limit before the invariant counts as broken."""
    summary: str
    """One line: what was seen."""
    check: str
    """What it means and what to look at."""
    derivation: str
    """Why a correct run satisfies it, and the false-alarm bound of the limit (docs/invariants.md)."""
    severity: str = "critical"
    after_updates: int = 0
    """Updates before which the statistic is not judged (start-up, where a property needs history)."""

    @property
    def statistic(self) -> str:
        return f"inv_{self.name}"

    @property
    def broken_key(self) -> str:
        return f"inv_broken_{self.name}"

    @property
    def per_batch(self) -> bool:
        """Judged on one batch's data alone: evidence about the actors that produced the batch."""
        return self.family in ATTRIBUTED_FAMILIES and self.name not in ACROSS_BATCHES

    @property
    def names_key(self) -> str:
        """Row key of the text naming the processes behind the evidence (Ray actors); empty where none is."""
        return f"{self.name}_named" if self.per_batch or self.name in NAMED_PROCESS else ""

    @property
    def rule_name(self) -> str:
        return "RLInvariant" + "".join(part.capitalize() for part in self.name.split("_"))

    def over(self, stats: dict, update: int) -> bool | None:
        """Whether this update's statistic in `stats` is over the limit; None when it was not measured (absent,
        NaN, not a number). Not judged, so never over, up to `after_updates`."""
        value = stats.get(self.statistic)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
            return None
        return update > self.after_updates and value > self.limit
