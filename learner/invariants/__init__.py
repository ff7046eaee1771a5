"""The learner's statistics of the invariants (telemetry/invariants.py), one 0-d tensor per update each.

Every statistic is 0 when its invariant holds exactly, larger the more it is
broken, NaN when this update did not measure it. They stay on the device and go
to the host with the update's other statistics (no `.item()`, no extra sync).
Every check but the optimizer's step counts and group membership (a few Python
look-ups) runs on *sampled* updates: each of the first 16, so a fault present
from the first batch is named in a few updates, then every 16th (`is_sampled`).
bench/invariant_cost.py times them inside real runs. The references below are
written apart from the code they check (no call into `returns`, `diagnostics` or
through the `ppo` module), in float64.

One module per family, each with its statistics' derivations and false-alarm
bounds (docs/invariants.md): `sampling` (the actor's record), `distribution`
(the formulas actor and learner share, against torch.distributions), `dataflow`
(returns, what each loss is handed, loss gradients), `optimisation` and
`optimizer_step` (a reference Adam), `telemetry` (the exported diagnostics
recomputed); `common` holds the float64 distributions they share, `hooks` the
calls PPOLearner makes.
"""

from .common import F64, LOSS_GRADIENT_TOLERANCE, NAN, SPREAD_FLOOR
from .dataflow import handoff_error, loss_gradient_errors, returns_error
from .distribution import DISTRIBUTION_TOLERANCE, distribution_error
from .hooks import DECLARED, KEYS, SAMPLED_EVERY, SAMPLED_FIRST, LearnerInvariants, is_sampled
from .optimisation import learning_rate_gap, optimizer_coverage, policy_share, scheduled_learning_rate
from .optimizer_step import AdamReference
from .sampling import TAU, observation_pairing, sampling_statistics
from .telemetry import FLOORS, arrival_disagreement, flat_target_spread

__all__ = ["DECLARED", "DISTRIBUTION_TOLERANCE", "F64", "FLOORS", "KEYS", "LOSS_GRADIENT_TOLERANCE", "NAN",
           "SAMPLED_EVERY", "SAMPLED_FIRST", "SPREAD_FLOOR", "TAU", "AdamReference", "LearnerInvariants",
           "arrival_disagreement",
           "flat_target_spread", "distribution_error", "handoff_error", "is_sampled", "learning_rate_gap",
           "loss_gradient_errors", "observation_pairing", "optimizer_coverage", "policy_share", "returns_error",
           "sampling_statistics", "scheduled_learning_rate"]
