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
from .invariants_recurrent import RECURRENT_INVARIANTS
from .invariants_resume import RESUME_INVARIANTS
from .verdicts import COMPONENTS, SEVERITIES

INVARIANTS: tuple[Invariant, ...] = (ACTOR_INVARIANTS + LEARNER_INVARIANTS + PIPELINE_INVARIANTS + RECURRENT_INVARIANTS
                                     + RESUME_INVARIANTS)

BY_NAME: dict[str, Invariant] = {i.name: i for i in INVARIANTS}

STAGES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("resume", "the state a resumed run starts from, against the state its checkpoint was saved from",
     ("resumed_weights_as_saved", "resumed_optimizer_as_saved", "resumed_preprocessing_as_saved")),
    ("env", "the env's own output under its declared contract",
     ("observation_space", "env_time_limit", "env_reset_restores")),
    ("distribution", "the action distribution's formulas, which actor and learner share",
     ("distribution_as_defined",)),
    ("weights", "the weights the actors act with, against the learner's as counted, published and requested",
     ("network_age_counted", "weights_as_stamped", "weights_current_at_request", "weights_frozen",
      "weight_loads_per_published_version")),
    ("record", "what the actor stores, against what the env received and returned",
     ("boundary_observations", "boundary_actions", "boundary_rewards", "boundary_episode_ends", "boundary_resets",
      "boundary_step_count", "acted_on_stored_observation", "acted_with_its_network",
      "observations_changed_before_acting",
      "running_returns_recomputed")),
    ("transfer", "the learner's copy of the batch, against the rollout as it arrived, once",
     ("learned_once", "received_as_sent")),
    ("state", "a recurrent actor's state: stored, carried and reset as its episodes say",
     ("initial_state_as_stored", "state_reset_at_episode_starts")),
    ("replay", "the learner's replay of each env's sequence, from the stored state", ("sequence_replay_recomputed",)),
    ("draws", "the actor's actions, against draws from the distributions it recorded",
     ("behaviour_record", "sampling_logp", "sampling_frequency", "streams_independent")),
    ("preprocessing", "the declared transforms and running statistics, from the raw stream",
     ("observations_transformed", "observation_statistics_recomputed", "reward_scaling_recomputed",
      "learner_sees_actor_data")),
    ("returns", "targets and advantages, from the returns' own inputs", ("returns_recomputed",)),
    ("loss inputs", "what each loss is handed, against what the stage before produced",
     ("value_loss_inputs", "policy_loss_inputs")),
    ("value head", "the values, as an affine head gives them", ("value_head_affine",)),
    ("loss", "each loss term's gradient, against its closed form",
     ("loss_gradient_policy", "loss_gradient_value", "loss_gradient_entropy", "policy_loss_as_configured")),
    ("gradient", "the gradient stepped with: this minibatch's, over every sample",
     ("gradient_of_loss", "minibatch_coverage")),
    ("clip", "the clipped gradient, against the global-norm clip", ("gradient_clipped_as_configured",)),
    ("optimizer step", "the step taken, against Adam with the configured settings on the pre-step state",
     ("learning_rate_as_configured", "optimizer_step_as_configured", "optimizer_state_kept", "optimizer_coverage",
      "policy_starved")),
    ("pipeline", "every sample, step and byte of every process accounted for",
     ("actor_accounting", "env_steps_accounted", "samples_dropped", "rollouts_retained", "memory_per_sample",
      "learner_waits_while_ready", "run_without_updates")),
    ("telemetry", "the exported diagnostics, against their recomputation",
     ("telemetry_recomputed", "episode_statistics", "exported_as_computed")),
)
"""The stages of a learn step in the data's path, upstream first, and the invariants that hold each stage's output
to its reference given its own inputs. The naming rule, for the run's verdicts and the doctor alike: of the
invariants broken at once, the one of the first stage names the component (a wrong upstream output makes every
downstream check disagree too; a wrong downstream stage leaves the upstream ones intact)."""

STAGE_RANK: dict[str, int] = {name: rank for rank, (_, _, names) in enumerate(STAGES) for name in names}


def check_invariants() -> None:
    for inv in INVARIANTS:
        if inv.component not in COMPONENTS or inv.severity not in SEVERITIES or inv.family not in FAMILIES:
            raise ValueError(f"invariant {inv.name}: bad component, severity or family")
        if inv.hold_updates < 1:
            raise ValueError(f"invariant {inv.name}: hold_updates must be at least 1")
    staged = [name for _, _, names in STAGES for name in names]
    if sorted(staged) != sorted(BY_NAME):
        raise ValueError(f"every invariant is in exactly one stage: {sorted(set(staged) ^ set(BY_NAME))}")



check_invariants()
