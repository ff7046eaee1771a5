"""The invariants: properties every correct actor-learner run satisfies, as data, and their monitor.

An invariant holds whatever the env, the reward scale, the hyperparameters or
the machine's speed. Each one is checked on the run's own data by a statistic
that the part owning the data computes once per update (the learner, the
actors' witness of raw env output, the run's accounting) under the row key
`inv_<name>`. Every statistic is oriented the same way: 0 when the invariant
holds exactly, larger the more it is broken, NaN (or absent) when this update
did not measure it (sampled checks, an empty batch).

An invariant is *broken* once its statistic exceeded `limit` on `hold_updates`
measured updates in a row: evidence counted in updates, never in seconds, so a
fast and a slow machine reach the same verdict after the same updates. Once
broken it stays broken (`inv_broken_<name>` = 1 for the rest of the run): a
correct system never breaks one, so the verdict is about the code, not a phase.
In a Ray run the invariants judged on one batch's data (`per_batch`) also
count a streak per actor incarnation that produced the batch: a fault in one
actor of eight is in a row among its own batches, not among the run's, and
the verdict names that actor (telemetry/attribution.py).

The component a broken invariant names is the part that owns the property,
which is why each invariant is written about one part only. This list is the
one source of the `RLInvariant...` health rules (telemetry.rules), the
catalogue's `rlvitals_invariant_*` series and docs/invariants.md; each entry's
`derivation` says why it holds and what bounds its false alarms.
"""

from __future__ import annotations

from .invariant_model import (  # noqa: F401  (the names every reader of the invariants uses)
    ACROSS_BATCHES,
    ATTRIBUTED_FAMILIES,
    FAMILIES,
    NAMED_PROCESS,
    Z_LIMIT,
    Invariant,
)
from .invariants_actor import ACTOR_INVARIANTS
from .invariants_learner import LEARNER_INVARIANTS
from .invariants_pipeline import PIPELINE_INVARIANTS
from .verdicts import COMPONENTS, SEVERITIES

INVARIANTS: tuple[Invariant, ...] = ACTOR_INVARIANTS + LEARNER_INVARIANTS + PIPELINE_INVARIANTS

BY_NAME: dict[str, Invariant] = {i.name: i for i in INVARIANTS}


def check_invariants() -> None:
    for inv in INVARIANTS:
        if inv.component not in COMPONENTS or inv.severity not in SEVERITIES or inv.family not in FAMILIES:
            raise ValueError(f"invariant {inv.name}: bad component, severity or family")
        if inv.hold_updates < 1:
            raise ValueError(f"invariant {inv.name}: hold_updates must be at least 1")



check_invariants()
