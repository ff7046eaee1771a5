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

import math
from dataclasses import dataclass

from .verdicts import COMPONENTS, SEVERITIES

ATTRIBUTED_FAMILIES = ("sampling", "boundary")
"""Families judged on one batch's data: in a Ray run, each actor's batches are judged apart, and the actors
whose batches break one are named (telemetry/attribution.py)."""
ACROSS_BATCHES = ("streams_independent",)
"""Of those, the invariants judged on the whole run's data (every stream's resets), not on one batch."""
NAMED_PROCESS = ("memory_per_sample", "weights_current_at_request")
"""Invariants judged on each process's own evidence outside a batch's data: the run names the processes."""

FAMILIES = {
    "sampling": "the actions in a batch are draws from the behaviour distribution the actor recorded for them, "
                "and every env draws its own episodes",
    "boundary": "what the learner trains on is what the env emitted, under the declared rules",
    "dataflow": "the loss's inputs and gradients equal an independent recomputation from the rollout",
    "optimisation": "every parameter that gets a gradient is stepped, and no loss term starves the others",
    "telemetry": "every exported diagnostic agrees with an independent slow recomputation",
    "pipeline": "every sample and second of every process is accounted for",
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


INVARIANTS: tuple[Invariant, ...] = (
    # ----------------------------------------------------------------- sampling (the actor)
    Invariant(
        "sampling_logp", "sampling", "actor", Z_LIMIT, 3,
        "Recorded log-probabilities are not those of draws from the recorded distributions",
        "Over the batch, the mean recorded log-probability of the sampled actions differs from minus the "
        "recorded distributions' mean entropy by more than sampling error allows: the actor does not act by "
        "drawing from the distribution it records (argmax or another temperature, another network's "
        "distribution stored, actions and distributions from different steps).",
        "For an action a drawn from mu(.|s), E[log mu(a|s)] = -H(mu(.|s)) and Var[log mu(a|s)] is a function of "
        "mu(.|s) alone. Given everything before it, each draw is independent, so D_i = log mu_i(a_i) + H_i is a "
        "martingale difference sequence and z = sum D_i / sqrt(sum Var_i + n tau^2) is asymptotically standard "
        "normal whatever the states' correlation (tau = 1e-3 nats absorbs float32 rounding of the recorded "
        "log-probabilities). Var: Categorical sum_k p_k (log p_k + H)^2, diagonal Gaussian d/2 (for the "
        "unsquashed draw the rollout stores; the runner clips only the env's copy). |z| > 6 has probability "
        "2e-9 per batch under the normal limit; without it, Chebyshev bounds a batch by 1/36 and the 3 batches "
        "in a row a break needs by 2e-5. Measured on sampled updates (the first 16, then every 16th). Healthy "
        "CartPole, Acrobot, Pendulum runs read at most 2.8."),
    Invariant(
        "sampling_frequency", "sampling", "actor", Z_LIMIT, 3,
        "Action frequencies do not match the recorded policies",
        "Some action is chosen far more or less often than the recorded distributions say it should be: the "
        "actor's sampler is biased (a wrong index, clipping or remapping of actions after the draw, a fixed "
        "action in some envs).",
        "Discrete actions: for each action k, count_k - sum_i mu_i(k) is a sum of martingale differences with "
        "variance sum_i mu_i(k)(1 - mu_i(k)); continuous actions: for each dimension j, the standardised draws "
        "(a_ij - m_ij) / sigma_ij sum to a martingale with variance n. The statistic is the largest |z| over "
        "actions or dimensions (tau as for sampling_logp in the discrete variance); with K of them the "
        "per-batch false-alarm bound is K x 2e-9 (Chebyshev: K / 36); measured on sampled updates as "
        "sampling_logp. Healthy runs read at most 3.1. Argmax "
        "acting on a policy whose preferred action varies by state keeps the mean frequencies: sampling_logp "
        "catches it."),
    Invariant(
        "behaviour_record", "sampling", "actor", 1e-3, 2,
        "Stored actions do not belong to their stored log-probabilities",
        "The log-probability the actor stored for each action differs from the log-probability of the stored "
        "action under the actor's own stored distribution: the stored actions are not the ones acted with "
        "(an off-by-one, a clipped or transformed action stored, actions and log-probabilities from different "
        "draws).",
        "The actor computes log mu(a) from the parameters it stores, for the action it stores: recomputing it "
        "from those two is exact up to float32 rounding (1e-5 nats), far below the limit of 1e-3."),
    Invariant(
        "streams_independent", "sampling", "actor", 0.0, 1,
        "Env streams replay each other's episodes",
        "Two or more envs of the run started the same sequence of episodes (their first reset observations are "
        "identical, beyond what chance allows): they are seeded alike (every actor given the run's seed, a "
        "vector env's sub-envs sharing one seed, a restarted actor replaying its first life), so the learner "
        "sees the same data several times.",
        "Reset observations are draws of the env's own random generator, so differently seeded envs start "
        "different episodes. A stream's signature is its first 6 reset observations; the chance that two "
        "independent streams share it is bounded from the coincidences within each stream ((equal pairs + 3) / "
        "pairs, to the 6th power), which duplicated streams do not inflate, and duplicates are only counted "
        "while all the run's pairs of streams together would coincide by chance less than 1e-6 times: envs "
        "with a fixed or few-valued start state are never judged. Resets are hashed as the env emitted them, "
        "one hash per episode end (actors/streams.py)."),
    # ----------------------------------------------------------------- boundary (env, actor)
    Invariant(
        "boundary_actions", "boundary", "actor", 0.0, 2,
        "Stored actions differ from the actions the env received",
        "A witness below the runner saw which action each env was stepped with; the rollout stores another: "
        "the actor stores actions shifted, overwritten or transformed after the step.",
        "The witness (actors/witness.py) wraps the vector env and copies, at every step, exactly what the env "
        "received and returned; a correct runner stores the same values (continuous actions are compared after "
        "the clipping the runner applies for the env), so any difference is a fault (exact; no false alarm unless "
        "an env writes into the action array it is given, as the action is copied when the step returns)."),
    Invariant(
        "boundary_rewards", "boundary", "actor", 1e-6, 2,
        "Stored rewards differ from the rewards the env returned",
        "The rollout's rewards are not the env's rewards at the same step: a shift, a transform or a scale "
        "applied before storing, or rewards of another env.",
        "The stored reward is the env's reward rounded to float32; the witnessed one is rounded the same way "
        "before comparing, so a correct run reads exactly 0 (no false alarm)."),
    Invariant(
        "boundary_episode_ends", "boundary", "actor", 0.0, 2,
        "Stored episode ends differ from what the env reported",
        "The rollout's terminated or truncated flags are not the env's: truncation stored as termination (or "
        "the reverse), or ends shifted by a step.",
        "The flags are copied from the env's own return values; any difference is a fault. Not measured (NaN) "
        "on an update where neither the env nor the rollout ended an episode."),
    Invariant(
        "boundary_observations", "boundary", "actor", 1e-6, 2,
        "Stored observations differ from what the env emitted",
        "The rollout's observation for a step is not the one the env emitted before it: stored one step off, "
        "or transformed before storing.",
        "Exact copy of the env's output, cast to the rollout's dtype; 4 random (t, env) positions per rollout are "
        "compared after the same cast, so a correct run reads 0. A fault touching a fraction f of positions is "
        "seen with probability 1 - (1 - f)^4 per rollout."),
    Invariant(
        "observations_transformed", "boundary", "preprocessing", 1e-6, 2,
        "Observations reach the learner transformed",
        "The observation the rollout holds for a step is neither the one the env emitted there nor the one of a "
        "neighbouring step: it was changed between the env and the learner (a scaling, normalisation or dtype "
        "applied on one side only). Apply the same preprocessing where the actor acts and where the learner "
        "learns, or neither.",
        "The witness keeps the env's own observation at sampled positions; a correct pipeline stores it "
        "unchanged (float32 rounding compared exactly, so a healthy run reads 0). A stored value found at the "
        "neighbouring step instead is a pairing fault and counts under boundary_observations."),
    Invariant(
        "boundary_resets", "boundary", "actor", 0.0, 2,
        "Transitions the env did not produce are learned from",
        "A step after an episode ended (the reset of NEXT_STEP autoreset, which has no action's consequence) is "
        "marked valid: the learner trains on transitions that never happened.",
        "Exact: the step following a done is a reset in every correct rollout. Not measured (NaN) on an update "
        "without a reset step."),
    Invariant(
        "boundary_step_count", "boundary", "actor", 0.0, 2,
        "The rollout's step count differs from the env's own step counter",
        "The env was stepped a different number of times than the rollout says: steps lost or duplicated "
        "between env and rollout.",
        "Exact count: env steps (vector steps x envs) and agent steps (those that are not resets) the witness "
        "saw, against the rollout's T x N and its valid count."),
    Invariant(
        "observation_space", "boundary", "env", 0.01, 5,
        "Observations fall outside the env's declared observation space",
        "More than 1% of the observations are outside the space the env declares (dtype, shape or bounds): "
        "the env breaks its own contract, or a wrapper changed observations without changing the space.",
        "A correct env's observations are members of its observation space; 1% tolerance covers envs whose "
        "declared bounds are loose conventions."),
    Invariant(
        "weights_as_stamped", "boundary", "weight-sync", 1e-9, 2,
        "Actors act with other weights than the network age they report",
        "The fingerprint of the weights an actor acted with differs from the learner's weights of the network "
        "age stamped on its rollout: weights are sent under the wrong age (a stale copy published as new), "
        "received but not loaded, or loaded into a network the actor does not act with.",
        "Fingerprints are float64 sums of the same parameters; the same weights agree to 1e-12 on any device."),
    Invariant(
        "acted_on_stored_observation", "boundary", "actor", 1e-3, 2,
        "Actors act on another step's observation than the one stored with the action",
        "On a batch of staleness 0 the learner's log-probability of each behaviour action disagrees with the "
        "actor's at the stored observation and agrees at a neighbouring step's: the actor computed its action "
        "from a stale or early observation (inference on the previous step's input, a buffer updated after the "
        "policy call) while the rollout stores the right one, so every action is paired with the wrong state.",
        "Same weights, same function: at the observation the actor acted on, the learner's log-probability "
        "equals the actor's up to float32 rounding (1e-5 nats), and at any other observation it differs. "
        "Counted here when the shifted disagreement is under 1% of the plain one (the rest is "
        "learner_sees_actor_data's); 1e-3 nats has no false alarm. Judged only at staleness 0."),
    Invariant(
        "learner_sees_actor_data", "boundary", "preprocessing", 1e-3, 2,
        "The learner and the actors disagree on the probability of the same action",
        "On a batch of staleness 0 the learner's network is the one that acted, so its log-probability of each "
        "behaviour action must be the actor's; it is not, so the learner reads other inputs than the actor did "
        "(a transform, normalisation or dtype on one side only). When the actor's own record or the rollout's "
        "observations are also wrong, the invariants of the actor, upstream, say so first; when a neighbouring "
        "step's observation explains the disagreement, acted_on_stored_observation counts it instead.",
        "Same weights, same observation, same function: equal up to float32 rounding of two batched forward "
        "passes (1e-5 nats); 1e-3 has no false alarm. Judged only at staleness 0."),
    # ----------------------------------------------------------------- dataflow (returns, policy, value)
    Invariant(
        "returns_recomputed", "dataflow", "returns", 1e-3, 2,
        "Value targets or advantages differ from an independent recomputation",
        "The targets and advantages the loss trained on are not what V-trace (GAE when fresh) gives on this "
        "rollout's rewards, episode ends and values with the run's gamma and lambda: the returns code "
        "discounts, bootstraps or cuts episodes wrongly.",
        "On sampled updates (each of the first 16, then every 16th) a float64 loop in the paper's notation "
        "(learner/reference_returns.py) recomputes v_s and A_s from the rollout's rewards (after the declared "
        "reward scaling), episode ends and validity, the learner's values at arrival and its log-rhos against "
        "the rollout's behaviour log-probabilities. Statistic: the larger of max|v - v_ref| / max|v_ref| and "
        "max|A - A_ref| / (max|A_ref| + 0.01 max|v_ref|) over the samples the minibatches train on. float32 "
        "recursion error is below 1e-5 of these scales (healthy runs: at most 2.2e-5), so 1e-3 has no false "
        "alarm."),
    Invariant(
        "loss_gradient_policy", "dataflow", "policy", 0.05, 2,
        "The policy loss's gradient is not that of the clipped surrogate on this batch's advantages",
        "dL/dlog pi differs from -ratio x advantage / B on the unclipped samples: the policy loss uses other "
        "advantages, ratios or behaviour log-probabilities than the batch's, or another formula.",
        "On each sampled update's first minibatch (the first 16, then every 16th) the gradient the backward pass left "
        "on log pi is compared with the closed form -A_i r_i / B where r_i A_i <= clip(r_i) A_i, else 0 (r from the "
        "rollout's behaviour log-probabilities, A normalised per minibatch as configured): ||g - g_ref|| / ||g_ref||. "
        "float32 error is 1e-6 relative (healthy runs: at most 3.4e-7), bfloat16 autocast rounds each gradient to "
        "about 4e-3, so 5% has no false alarm."),
    Invariant(
        "loss_gradient_value", "dataflow", "value", 0.05, 2,
        "The value loss's gradient is not c_v (V - target) / B",
        "The value loss does not pull each value towards its target with the configured coefficient: detached "
        "values, other targets, a wrong sign or scale.",
        "Closed form c_v (V_i - t_i) / B of the squared error's gradient, compared as for the policy term (1 "
        "when the values are detached); tolerance as for the policy term."),
    Invariant(
        "loss_gradient_entropy", "dataflow", "policy", 0.05, 2,
        "The entropy term is not -c_H H(pi) / B",
        "The entropy bonus enters the loss with another sign or weight than configured, or the entropies it is "
        "given are not those of the policy's distributions (a negated or mis-computed entropy).",
        "Closed form -c_H / B, compared as for the policy term (not measured when entropy_coef is 0), and the "
        "entropies the loss was given against the closed form of the minibatch's distribution parameters: "
        "max|H - H_ref| / max(max|H_ref|, 1 nat), float32 rounding 1e-6; the larger of the two counts, so a "
        "distribution whose entropy is wrong is named even at entropy_coef 0. Tolerance as for the policy "
        "term."),
    # ----------------------------------------------------------------- optimisation
    Invariant(
        "learning_rate_as_configured", "optimisation", "optimizer", 1e-6, 2,
        "The optimizer steps with another learning rate than the config's schedule",
        "The learning rate in the optimizer's parameter groups differs from the one the config asks for at this "
        "point of the run (learning_rate, decayed linearly to 0 over total_env_steps with anneal_lr): the "
        "optimizer was built without the configured rate (a library default), the schedule is computed wrong "
        "(a decay on updates instead of env steps, a fraction inverted), or the rate is never set.",
        "The reference recomputes the schedule from the config and the run's env steps at the batch's arrival, "
        "apart from the code that sets it, and reads every group's rate after the update; a correct run sets "
        "exactly that float, so the relative difference is 0 (limit 1e-6)."),
    Invariant(
        "optimizer_state_kept", "optimisation", "optimizer", 0.0, 2,
        "The optimizer's state does not carry over from step to step",
        "Some parameters' optimizer step count (Adam's) did not advance by exactly the update's number of "
        "steps: the optimizer's state (its moment estimates) is cleared, replaced or rebuilt between steps, so "
        "every step behaves as Adam's first, or some steps never reached those parameters.",
        "Adam increments each stepped parameter's count once per step and keeps it, so over an update of k "
        "steps every parameter with a gradient advances by exactly k; the counts are exact (no false alarm). "
        "Not measured for optimizers without a step count; an update the non-finite guard undid restarts the "
        "moments after it is judged."),
    Invariant(
        "gradient_clipped_as_configured", "optimisation", "optimizer", 1e-3, 2,
        "The gradient is not clipped as configured",
        "The gradient the optimizer steps with is not the minibatch's gradient clipped by its global norm to "
        "max_grad_norm: it is clipped per parameter or by value, at another norm, not at all, or changed "
        "between the clip and the step. Every step is then larger or smaller than configured, and in other "
        "directions when parameters are clipped apart.",
        "On each sampled update's first minibatch, the flat gradient after the clip, c, against the one before it, g. "
        "Clipping by the global norm gives exactly g * min(1, max_grad_norm / ||g||); the statistic is "
        "||c - g * min(1, max_grad_norm / ||g||)|| / ||g * min(...)||, float32 rounding (about 1e-7) in a "
        "correct learner in any precision, so the limit 1e-3 leaves room for nothing but a fault (no false "
        "alarm). Clipping each parameter on its own, by value or at another norm reads 1e-2 and more."),
    Invariant(
        "minibatch_coverage", "optimisation", "optimizer", 0.0, 2,
        "The update's minibatches do not cover the batch once per epoch",
        "Some valid samples of the batch took part in more or fewer minibatch steps than there are epochs: "
        "minibatches drawn with replacement, the same minibatch reused, a slice that leaves samples out, or "
        "reset steps and padding trained on. The update learns from other data than the batch it was given.",
        "Each epoch shuffles the batch's valid samples and splits them into minibatches, so every one is in "
        "exactly update_epochs minibatch steps. The learner counts, from the index tensors the steps were "
        "given, each sample's steps on sampled updates (one scatter-add per minibatch, on the device); the "
        "statistic is the share of samples whose count differs. Exact: no false alarm."),
    Invariant(
        "optimizer_coverage", "optimisation", "optimizer", 0.0, 2,
        "Parameters with a gradient are not stepped by the optimizer",
        "Some parameter received a gradient in this update and did not change (or is not in any optimizer "
        "group): it is frozen by mistake, left out of the optimizer, or its update is undone.",
        "Count of parameters requiring a gradient that are in no optimizer group (every update), plus, on sampled "
        "updates, those whose gradient on the first minibatch is above 1e-6 of the largest parameter's and that did "
        "not change at all over the update. Adam's first step on such a gradient moves it by about lr (lr g / (|g| + "
        "eps)), far above float32 resolution, and later steps would have to undo it exactly; exact, so no false alarm. "
        "The 'did not change' part is not judged while the learning rate is 0 (the statistic is then the missing count "
        "where there is one, else not measured)."),
    Invariant(
        "gradient_of_loss", "optimisation", "optimizer", 1e-3, 2,
        "The optimizer steps with gradients that are not this minibatch's",
        "The value head's bias gradient differs from sum_i dL/dV_i, which it must equal: gradients from earlier "
        "steps are still in .grad (zero_grad missing or misplaced) or something else writes into them.",
        "On each sampled update's first minibatch: the norm of every parameter's .grad between zero_grad and the "
        "backward pass, against its norm after it. What the optimizer steps with must be this backward "
        "pass's alone, so a correct learner reads exactly 0 in any precision (no false alarm; 1e-3 leaves "
        "room for nothing but a fault). A missing or misplaced zero_grad (or a parameter the optimizer does "
        "not zero) leaves about max_grad_norm of the last clipped step against a gradient norm of 5 to 50: "
        "0.01 to 0.1, which the value-bias projection exported as gradient_mismatch (limit 0.05 for "
        "bfloat16's sake) misses about half the time."),
    Invariant(
        "policy_starved", "optimisation", "preprocessing", 1e4, 20,
        "The policy's share of the clipped update is near zero",
        "The gradient is clipped and the policy term's gradient is less than 1/10,000 of the total: a value "
        "loss many orders of magnitude larger than the policy's leaves the policy almost no step. Rewards or "
        "targets are far out of scale: normalise rewards (--normalize-rewards) or check the reward scale.",
        "On sampled updates, when the first minibatch's gradient is clipped: ||g|| / ||g_policy|| with "
        "g_policy the gradient of the policy term alone; 0 when not clipped; not measured when g_policy is "
        "exactly 0 (all samples clipped) or loss_gradient_policy is broken (the term is then not the "
        "surrogate). Normalised advantages keep the policy term's gradient at its own scale while the value "
        "term's grows with the targets': the ratio is about 100 to 250 times the reward per step. Healthy "
        "runs after update 10: CartPole at most 6e2 (median 1.5e2), Acrobot 3.7e2, Pendulum 1.2e3 at gamma "
        "0.9 and 4.2e3 (median 1.5e3) at gamma 0.99 with raw rewards of -16 a step; rewards x 1e6 read 3e7 "
        "to 1e8. 1e4 sustained for 20 sampled updates needs value errors ~1e4 times the advantages' spread.",
        severity="warning", after_updates=10),
    # ----------------------------------------------------------------- telemetry
    Invariant(
        "telemetry_recomputed", "telemetry", "telemetry", 1e-3, 2,
        "An exported diagnostic disagrees with its independent recomputation",
        "On a sampled batch, a diagnostic the learner exported (residual variance, entropy, KL, clip "
        "fraction, advantage or target statistics) differs from a slow float64 recomputation from the same "
        "tensors: the diagnostic itself is broken (arguments swapped, wrong mask, wrong distribution).",
        "On sampled updates, float64 code of its own recomputes residual variance, relative entropy, value, "
        "target and advantage mean and std, the KL (from the last epoch's minibatch parameters) and the clip "
        "fraction (every step's) from the same tensors. Statistic: the largest |exported - reference| / "
        "max(|reference|, floor), floors 0.01 (residual variance, relative entropy), 0.1 (clip fraction), "
        "1e-3 nats (KL), 1% of |mean| + std (means, stds); undefined on one side only counts 1. float32 "
        "against float64 differs by about 1e-6 of these (healthy runs: at most 1.6e-5). The clip fraction "
        "and entropy come from the loss's own parts: they are not held against telemetry on updates where "
        "loss_gradient_policy or loss_gradient_entropy is broken, which name the fault there."),
    Invariant(
        "episode_statistics", "telemetry", "telemetry", 1e-6, 2,
        "Reported episode returns or lengths differ from the env's own rewards",
        "The episodes the actors report (the returns and lengths every return curve, the solve threshold and "
        "the episode metrics are made of) are not the sums and counts of the rewards and steps the env "
        "returned, as a witness below the runner recorded them: the episode bookkeeping is wrong (a reward "
        "left out or counted twice, a reset step counted, scaled or clipped rewards summed, an episode lost), "
        "while the learner's data may be right.",
        "For every episode that began and ended inside a witnessed rollout, the witness's rewards summed over "
        "its agent steps and counted give its return and length; both sides add the same float32 rewards in "
        "float64, so they agree to about 1e-15 of the episode's sum of |reward| (limit 1e-6); lengths and the "
        "number of episodes are exact. Episodes that began in an earlier rollout are not recomputed: nothing "
        "is carried across rollouts and the actors pay nothing (actors/episode_witness.py)."),
    # ----------------------------------------------------------------- pipeline (evidence, not seconds)
    Invariant(
        "samples_dropped", "pipeline", "weight-sync", 0.5, 8,
        "Most samples arriving are dropped as stale",
        "Over the last batches, more than half of the samples that arrived were thrown away as older than "
        "--max-staleness: actors act with old weights (weights not published or not loaded).",
        "With oldest-first arrival a batch is at most (queued batches) updates old, below the staleness limit "
        "in a correct run; the share is counted over arrivals, not seconds.",
        severity="critical"),
    Invariant(
        "weights_frozen", "pipeline", "weight-sync", 0.0, 1,
        "Actors act with a network age that stopped changing",
        "The learner has made more updates than its queues can hold since the newest network age it saw in a "
        "batch last changed: new weights are not published to the actors, or actors never load them.",
        "Each batch is requested with the weights current at request time, so after more updates than there "
        "are batches in flight, some batch must come from a newer network."),
    Invariant(
        "weights_current_at_request", "pipeline", "weight-sync", 0.0, 1,
        "Actors act with older weights than the learner had when it asked them",
        "A rollout's network age is older than the learner's network when the rollout was requested: the "
        "weights are not published with every request, or an actor keeps acting with weights it had instead of "
        "loading those handed to it (a load skipped or failed, a cache that keeps old weights). The age is "
        "stamped honestly (weights_as_stamped holds), so only this says the samples are staler than the queue "
        "explains. Judged in learner steps (the unit of network age). In a Ray run the verdict says where the gap "
        "arose: the publication (requests handed older weights than the learner's), or the actors, named, that "
        "acted behind the weights they were handed.",
        "The driver publishes after every update and hands the newest weights with each request (local mode: "
        "the learner's own network acts), and an actor loads what it is handed before it steps, so the age "
        "stamped on a rollout equals the learner's age at its request. Counted on every arriving rollout, "
        "learned from or dropped as stale. Statistic: the most learner steps a rollout acted behind its "
        "request, over the rollouts since the last update; exact counts, no false alarm."),
    Invariant(
        "memory_per_sample", "pipeline", "memory", 64.0, 1,
        "Memory in use grows with every sample processed",
        "A process's memory in use (private resident memory less the allocator's free bytes) rose by more than "
        "64 bytes per sample it processed, in both quarters of the later half of its run and by more than 48 MiB "
        "there: something keeps every rollout, batch or tensor it sees. Judged for the learner on the samples it "
        "learned from and, in Ray mode, for each actor incarnation on the samples it produced.",
        "A correct process's memory in use is flat once its buffers exist; one-off allocations do not grow in "
        "both quarters. Resident memory is not used: the allocator's free lists grow with fragmentation (a "
        "healthy LunarLander run gains about 150 bytes of RSS per sample, about 4 of them in use) and shared "
        "pages (Ray's object store) count in it. Envs that leak natively count: Box2D keeps about 1.7 kB per "
        "LunarLander episode, 15 bytes per sample, under the limit. Objects held in Ray's object store are not "
        "process memory and are not judged here.",
        severity="warning"),
    Invariant(
        "rollouts_retained", "pipeline", "memory", 0.0, 16,
        "Rollouts pile up in the learner's memory",
        "The learner process holds more rollouts than its queues, the batch in hand and one arriving can "
        "account for, update after update: something keeps batches after learning from them (a list of past "
        "rollouts, a replay buffer without a limit, tensors referenced from logged statistics).",
        "Queues are bounded by their capacity; a correct learner frees each batch after its update, so the "
        "rollouts alive never exceed capacity + 4. The count is exact; 16 updates in a row rule out a burst."),
    Invariant(
        "actor_accounting", "pipeline", "actor", 0.0, 1,
        "The learner received more rollouts from an actor than that actor produced",
        "Ray mode: the driver counts more rollouts from an actor incarnation than the actor's own counters say "
        "it produced when it delivered them: rollouts are received twice or credited to the wrong actor.",
        "Each rollout carries its actor's counters as they were when it was delivered, and they count it, so a "
        "correct pipeline never receives more than was produced. Exact counts: no false alarm."),
    Invariant(
        "learner_waits_while_ready", "pipeline", "throughput", 0.1, 4,
        "The learner waits while finished rollouts are ready",
        "Ray async mode: when the learner started waiting for its next batch a finished rollout was already "
        "there, yet it stayed blocked well beyond fetching it, update after update: the learner's loop waits "
        "on something else first (a barrier on every request in flight, the oldest or newest request, a "
        "sleep) while actors' work sits unused. Look at the learner's `wait` phase and the actors' "
        "`work_wait` phase (rlvitals_actor_phase_seconds_total): both grow together.",
        "A zero-timeout ray.wait at the start of the learner's wait (or a rollout already prefetched) says "
        "whether a finished rollout is ready; if so, a correct loop takes it and blocks only while the "
        "fetching thread gets and unpacks it. Statistic: the seconds the learner stayed blocked beyond that "
        "fetch (timed in the fetching thread), as a share of its loop since the previous wait began; the "
        "largest over the waits since the last update; not measured when nothing was ready, in synchronous "
        "Ray mode (which waits for every actor by design) and in local mode (which collects its own). What "
        "remains in a correct loop is two non-blocking ray.wait calls and a thread hand-off: under a "
        "millisecond on an idle machine, up to 8 ms at load average 11 on 2 cores, against a loop of one "
        "update (tens of milliseconds on a GPU, hundreds on a loaded CPU). Healthy async CartPole runs on "
        "that loaded 2-core machine read a median of 0 and at most 0.021 over 156 measured updates (2 "
        "actors; 3 actors with seeds 0 and 1), none above half the limit. A false alarm needs the learner "
        "stalled inside those calls for a tenth of its loop on 4 measured updates in a row: with the "
        "observed per-update rate below 1/156, under 2e-9 per update if stalls were independent (a machine "
        "frozen for seconds, one stall seen on consecutive updates, is the residual risk). A learner that "
        "waits for every request in flight reads a median of 0.2 (0.07 to 0.5) on the same machine, the "
        "share of one rollout's collection in the learner's loop, and more where the learner is faster.",
        severity="warning"),
    Invariant(
        "run_without_updates", "pipeline", "throughput", 0.0, 1,
        "The run ended without a single update",
        "Env steps were taken, but the learner never learned from a batch: every batch was dropped or none "
        "arrived. Look at the drop counts in summary.json, the actors' logs and the learner's phase times.",
        "Judged once, when the run ends: a correct run that took env steps learned from at least one batch."),
)

BY_NAME: dict[str, Invariant] = {i.name: i for i in INVARIANTS}


def check_invariants() -> None:
    for inv in INVARIANTS:
        if inv.component not in COMPONENTS or inv.severity not in SEVERITIES or inv.family not in FAMILIES:
            raise ValueError(f"invariant {inv.name}: bad component, severity or family")
        if inv.hold_updates < 1:
            raise ValueError(f"invariant {inv.name}: hold_updates must be at least 1")


check_invariants()


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
