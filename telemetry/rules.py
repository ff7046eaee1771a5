"""The health rules: what must hold in a correct run, as data.

This list is the one source of the Prometheus alert rules
(deploy/prometheus/rules/rlvitals.yml), the healthy bands and threshold lines
the dashboards and the report draw, the rule reference (docs/health.md) and the
health monitor that writes verdicts.json (telemetry.health). Each condition is
written from a principle that holds on every env, never from one env's numbers.

Evidence, not seconds: a rule on the run's statistics is judged on every row
the run records, and its hold and windows count learner updates
(telemetry/conditions.py), so the same run reaches the same verdict at the same
update on a fast and a slow machine. The run's own monitor counts how many
updates each condition has held and exports it (`rlvitals_rule_held_updates`);
the Prometheus alert fires on that count, so alerts and verdicts.json agree.
Only live-only rules count seconds (Prometheus `for`): their evidence is a
scrape's health, GPU memory, or progress that stopped, which no row records.

- `fast` rules decide within tens of updates, for states that are never
  healthy once the first updates are done;
- `slow` rules read trends over thousands of updates, for states that are only
  suspicious when they last (a value net that never catches up).

Thresholds on values are scale-free: value-like signals are judged against the
reward scale and the horizon 1/(1 - gamma) the learner reports.
"""

from __future__ import annotations

from .conditions import Abs, Delta, Increase, Mean, Median
from .fleet_rules import FLEET
from .invariants import INVARIANTS, STAGE_RANK, Invariant
from .rule_model import (  # noqa: F401  (the names every reader of the rules uses)
    EXTRA_ROW_KEYS,
    HELD_KEY,
    HELD_METRIC,
    HEURISTIC_RANK,
    HORIZONS,
    INVARIANT_BROKEN_METRIC,
    Live,
    Rule,
    S,
    thresholds,
)
from .verdicts import COMPONENTS, SEVERITIES

# The same network on the same observation gives the same log-probability; the
# learner's batched forward pass may round differently from the actor's.
LOGP_TOLERANCE = 1e-3

# A healthy run drops nothing, so one drop is news; the alert clears once this many updates pass without one.
DROP_WINDOW = 10

# A correct loss reads >= 0 on every loss direction up to float rounding (healthy: about 0.01 to 1).
DIRECTION_TOLERANCE = 1e-6

# The value bias's gradient against sum_i dL/dV_i: float32 rounds to 1e-7, bfloat16 to about 1e-2.
GRADIENT_TOLERANCE = 0.05
# A head without gradient is the head's fault only when the gradients are the loss's (not zeroed, say, after backward).
GRADIENTS_OF_LOSS = S("gradient_mismatch") <= GRADIENT_TOLERANCE
INFERENCE_COST_LIMIT = 15.0
"""An actor's inference phase per step over its bare forward pass, in CPU seconds (rlvitals/costs.py): healthy runs
read 1.6 to 3.2, a one-step bandit up to 7 on a loaded machine."""
ENV_STEP_COST_LIMIT = 2.5
"""An actor's env-step phase per step over one step of a copy of the env as gymnasium builds it, in CPU seconds of the
stepping thread (rlvitals/costs.py): healthy runs read 0.8 to 1.5 (the witness and the reward check on top)."""
MINIBATCH_COST_LIMIT = 4.0
"""The learner's minibatch phase per step over a copy of its network's forward, backward and optimizer step on a
minibatch of the configured size, in CPU seconds (rlvitals/costs.py): healthy runs read 1.1 to 2.2."""
VALUE_HEAD_TOLERANCE = 0.05
"""value_head_affine's limit: the value-bias identity behind gradient_mismatch needs an affine value head."""
# Fingerprints of the same weights agree to float64 rounding, whatever device summed them.
WEIGHTS_TOLERANCE = 1e-9
# A learner/actor mismatch says something about observations only when the actor's own record is consistent
# and it acted with the weights it claims.
RECORD_CONSISTENT = (S("record_discrepancy") <= LOGP_TOLERANCE) & (S("weights_mismatch") <= WEIGHTS_TOLERANCE)

# Samples from the learner's current or previous network: only then is a policy that moves too far from
# the one that acted the optimizer's doing. Samples that waited in queues (Ray's asynchronous loop) were
# acted on by a policy many optimizer steps back, and a healthy run's clip fraction there passed 0.3.
FRESH = S("staleness_batches") <= 1

# Slow rules judge trends over thousands of updates (a CartPole run does a few updates a second, Atari fewer).
SLOW_WINDOW = 1000
SLOW_HOLD = 2000
# Env steps per wall second over the last SLOW_WINDOW updates, and the same 4,000 updates earlier.
STEPS_PER_SECOND = Delta(S("env_steps"), SLOW_WINDOW) / Delta(S("wall_seconds"), SLOW_WINDOW)
STEPS_PER_SECOND_BEFORE = Delta(S("env_steps").shifted(2 * SLOW_HOLD), SLOW_WINDOW) / \
    Delta(S("wall_seconds").shifted(2 * SLOW_HOLD), SLOW_WINDOW)

RULES: tuple[Rule, ...] = (
    # ------------------------------------------------------------------ fast: learning
    # Info only: where one action is right everywhere (a probe, a solved task) collapse is the optimum.
    # Discrete policies only: a Gaussian's entropy has no maximum to be a share of (entropy_bounded 0).
    Rule("RLPolicyEntropyCollapsed", (S("relative_entropy") < 0.01) & (S("entropy_bounded") > 0.5), 15, "fast",
         "info", "policy",
         "Policy entropy collapsed to under 1% of its maximum in run {{ $labels.run_id }}",
         "The policy is almost deterministic. Unless the task has one right action everywhere, it stopped "
         "exploring: check the entropy bonus (its sign and --entropy-coef), the reward scale, and the "
         "clip fraction and KL for oversized updates.", after_updates=10),
    Rule("RLPolicyEntropyStuckAtMax", (S("relative_entropy") > 0.995) & (S("entropy_bounded") > 0.5), 20, "fast",
         "warning", "policy",
         "Policy entropy stays at its maximum in run {{ $labels.run_id }}",
         "The learner keeps updating and the policy stays uniform: no policy is being learned. Check that "
         "the policy loss reaches the policy head, the advantages' sign and shape (a broadcast to a matrix "
         "averages them away), and that the env's rewards depend on actions (rlvitals doctor).",
         after_updates=20),
    # A Gaussian policy is judged by its change from the initial policy: every standard deviation 55 times
    # narrower (-4 nats per dimension) is a policy that stopped exploring. Info, as a collapse can be optimal.
    Rule("RLPolicySpreadCollapsed", (S("entropy_change") < -4.0) & (S("entropy_bounded") < 0.5), 15, "fast",
         "info", "policy",
         "The Gaussian policy's spread collapsed in run {{ $labels.run_id }}",
         "Every action dimension's standard deviation is over 50 times narrower than the initial policy's: it "
         "barely explores. Unless the task needs exact actions, check the entropy bonus (its sign and "
         "--entropy-coef), the reward scale, and the KL and clip fraction for oversized updates.",
         after_updates=10),
    # With normalised advantages the surrogate's gradient does not scale with the rewards: a healthy,
    # undecided policy's head reads 1e-3 and up, a disconnected one 0 or rounding noise (1e-9).
    Rule("RLPolicyGetsNoGradient",
         (S("grad_norm_policy") < 1e-7) & (S("advantage_std") > 0) & (S("relative_entropy") > 0.1)
         & GRADIENTS_OF_LOSS, 10, "fast", "critical", "policy",
         "The policy head gets no gradient in run {{ $labels.run_id }}",
         "Advantages vary and the policy is undecided, yet the policy head's gradient is zero: the policy "
         "loss does not reach it (a detached log-probability or ratio, a zeroed loss term, advantages that "
         "average out through a wrong broadcast).", after_updates=3),
    # A head that fits its targets exactly (a probe, solved) also reads 0: only a loss left to learn counts.
    Rule("RLValueGetsNoGradient",
         (S("grad_norm_value") < 1e-10) & (S("value_loss") > 1e-6 * S("target_std") * S("target_std"))
         & GRADIENTS_OF_LOSS, 10, "fast",
         "critical", "value",
         "The value head gets no gradient in run {{ $labels.run_id }}",
         "The value loss is far from zero, yet the gradient of the value head's parameters is zero: the "
         "value loss does not reach it (detached values, a value coefficient of 0, targets compared with themselves).",
         after_updates=3),
    Rule("RLKLZeroWhilePolicyMoves",
         (S("kl") <= 0) & (S("grad_norm_policy") > 1e-10) & (S("step_meansq") > 0), 10, "fast", "warning",
         "telemetry",
         "KL(behaviour || learner) reads exactly 0 while the policy is updated in run {{ $labels.run_id }}",
         "The policy head gets gradients and the weights change, so the learner's policy cannot equal the "
         "behaviour policy: the KL diagnostic itself is broken (wrong distributions compared, or compared "
         "before the update). Do not raise the learning rate because of it.", after_updates=3),
    Rule("RLKLNegative", S("kl") < -1e-4, 0, "fast", "critical", "telemetry",
         "Negative KL divergence in run {{ $labels.run_id }}",
         "KL(behaviour || learner) is computed exactly from stored action distributions and cannot be "
         "negative: the stored behaviour distributions, the log-probabilities or the pairing of samples "
         "with their distributions is wrong."),
    # Per-sample invariants of any correct loss (learner/diagnostics.py loss_directions): exact, so no hold.
    Rule("RLPolicyLossAgainstAdvantages", S("policy_loss_direction") < -DIRECTION_TOLERANCE, 0, "fast",
         "critical", "policy",
         "The policy loss moves the policy against the advantages in run {{ $labels.run_id }}",
         "The gradient of the loss raises the log-probability of actions with below-average advantage and "
         "lowers it for the better ones: the surrogate has a sign error (advantages negated, the ratio "
         "computed as behaviour / learner, a loss maximised instead of minimised).", after_updates=2),
    Rule("RLValueLossPushesAway", S("value_loss_direction") < -DIRECTION_TOLERANCE, 0, "fast", "critical",
         "value",
         "The value loss pushes values away from their targets in run {{ $labels.run_id }}",
         "The gradient of the loss moves each value away from its target: the value loss's sign is flipped "
         "or its terms are swapped with something else (targets and values exchanged in a non-symmetric "
         "loss, a negative value coefficient).", after_updates=2),
    Rule("RLEntropyBonusReversed", S("entropy_loss_direction") < -DIRECTION_TOLERANCE, 0, "fast", "critical",
         "policy",
         "The loss penalises policy entropy instead of rewarding it in run {{ $labels.run_id }}",
         "Lowering the loss lowers the policy's entropy: the entropy bonus is added with the wrong sign (or "
         "--entropy-coef is negative), so the policy is driven to a deterministic one and stops exploring.",
         after_updates=2),
    # The identity holds for an affine value head only: a squashed head is the value's fault (value_head_affine).
    Rule("RLGradientNotThisLoss", (S("gradient_mismatch") > GRADIENT_TOLERANCE)
         & (S("inv_value_head_affine") <= VALUE_HEAD_TOLERANCE), 10, "fast", "critical",
         "optimizer",
         "The optimizer steps with gradients that are not this minibatch's in run {{ $labels.run_id }}",
         "The value head's bias gradient differs from the sum of the loss's gradients with respect to the "
         "values, which it must equal: gradients from earlier steps are still in .grad (zero_grad missing, or "
         "called after backward) or something else writes into them.", after_updates=2),
    # Discrete policies only. For a Gaussian policy a step of KL k makes log-ratios of spread about sqrt(2k) at
    # every dimension count, so a healthy PPO step (k about 0.02) already puts over 30% of ratios outside the clip
    # range (seen: 35% on a bandit solved exactly); its step size is judged by the KL (RLPolicyStepsTooLarge).
    # Healthy readings stay within 1.6 to 3.2 (CartPole with 4 to 32 envs, Pendulum, 8 Ray actors on 2 cores), a
    # one-step bandit's up to 7 on a loaded machine: both sides are CPU seconds of the actor's own process.
    Rule("RLActorInferenceOverCost", Mean(S("actor_inference_cost_ratio"), 5) > INFERENCE_COST_LIMIT, 5, "fast",
         "warning", "actor",
         "An actor's inference phase costs far more than its network's forward pass in run {{ $labels.run_id }}",
         "Per env step, the actor spends over 15 times the CPU time of its policy network's bare forward pass on "
         "the same batch "
         "choosing its action: work hidden in the step that the network does not need (a copy or checksum of "
         "the weights, a conversion per sample, a forward pass repeated). Profile the actor's step "
         "(rlvitals_actor_phase_seconds_total by phase).", after_updates=2),
    Rule("RLActorEnvStepOverCost", Mean(S("actor_env_step_cost_ratio"), 5) > ENV_STEP_COST_LIMIT, 5, "fast",
         "warning", "actor",
         "An actor's env-step phase costs far more than the env's own step in run {{ $labels.run_id }}",
         "Per env step, the actor spends over 2.5 times the CPU time that one step of a copy of the env, as gymnasium "
         "builds it, takes in the same process: work hidden around the env's step (a per-env Python loop, a copy "
         "of every observation, a wrapper that does more than it passes on). The project's own wrappers cost a few "
         "per cent. Profile the actor's env step (rlvitals_actor_phase_seconds_total by phase).", after_updates=2),
    # Healthy readings stay within 1.1 to 2.2 (CartPole, Pendulum, loaded 2-core machine): the product's loss,
    # running sums and sampled invariant checks on top of the bare step.
    Rule("RLLearnerMinibatchOverCost", Mean(S("learner_minibatch_cost_ratio"), 5) > MINIBATCH_COST_LIMIT, 5,
         "fast", "warning", "learner",
         "The learner's minibatch step costs far more than its network's own step in run {{ $labels.run_id }}",
         "Per optimizer step, the learner spends over 4 times the CPU time of a forward, backward and optimizer "
         "step of a copy of its network on a minibatch of the configured size: work hidden in the minibatch step "
         "(a forward pass repeated, a copy of the weights or a host round trip per step, statistics computed per "
         "sample). Profile the learner's update (rlvitals_learner_phase_seconds_total by phase).", after_updates=2),
    Rule("RLClipFractionHigh", (Mean(S("clip_fraction"), 30) > 0.3) & (S("entropy_bounded") > 0.5) & FRESH, 10,
         "fast", "warning", "optimizer",
         "Many samples leave the PPO clip range in run {{ $labels.run_id }}",
         "Averaged over 30 updates, over 30% of the probability ratios leave the clip range: each batch moves the "
         "policy far beyond the trust region. Lower the learning rate or the epochs per batch; in Ray mode "
         "check sample staleness.", after_updates=5),
    # PPO is built to move the policy by about 0.01 nats per batch; staleness adds a few updates' worth. The median:
    # a healthy run has the odd spike (Pendulum at the classic settings: KL 1.6 and 5.9 at two updates of 136,
    # every other under 0.15), which a mean over 30 updates read as a warning.
    Rule("RLPolicyStepsTooLarge", (Median(S("kl"), 30) > 0.2) & FRESH, 10, "fast", "warning", "optimizer",
         "Each update moves the policy far from the one that acted in run {{ $labels.run_id }}",
         "Over the last 30 updates, KL(behaviour || learner) after most batches' updates (the median) exceeds 0.2 "
         "nats, twenty times what PPO aims at: the learning rate (or epochs per batch) is far too high, or samples "
         "are very stale. Lower the learning rate first.", after_updates=5),
    Rule("RLValueTargetsOutOfScale", S("value_target_scale") > 2, 15, "fast", "warning", "returns",
         "Value targets exceed what the rewards allow in run {{ $labels.run_id }}",
         "A return can be at most r_max / (1 - gamma) in size, and the targets are more than twice that: "
         "rewards are accumulated without discounting, bootstrapped from the wrong state, or gamma is "
         "applied the wrong way.", after_updates=5),
    Rule("RLActorWeightsNotAsStamped", S("weights_mismatch") > WEIGHTS_TOLERANCE, 5, "fast", "critical",
         "weight-sync",
         "Actors act with other weights than the network age they report in run {{ $labels.run_id }}",
         "The fingerprint of the weights an actor acted with differs from the learner's weights of the network "
         "age stamped on its rollout: weights are sent under the wrong age (a stale copy published as new), "
         "received but not loaded, or loaded into a network the actor does not act with."),
    Rule("RLBehaviourRecordInconsistent", S("record_discrepancy") > LOGP_TOLERANCE, 5, "fast", "critical", "actor",
         "The actors store actions their recorded probabilities do not belong to in run {{ $labels.run_id }}",
         "The log-probability the actor recorded for each action does not match the action stored with it under "
         "the actor's own recorded distribution: the stored actions are not the ones acted with (an off-by-one, "
         "a clipped or transformed action stored, actions and log-probabilities from different draws)."),
    Rule("RLBehaviourLogpMismatch",
         (S("logp_discrepancy") > LOGP_TOLERANCE) & (S("logp_discrepancy_shifted") > 0.01 * S("logp_discrepancy"))
         & RECORD_CONSISTENT,
         10, "fast", "critical", "preprocessing",
         "Actors and learner disagree on the probability of the same action in run {{ $labels.run_id }}",
         "With staleness 0 the learner's network is the actor's, so its log-probability of each behaviour "
         "action must equal the actor's. It does not, and a one-step shift does not explain it: the learner "
         "sees other observations than the actors (a transform, normalisation or dtype on one side only)."),
    Rule("RLObservationsPairedWrong",
         (S("logp_discrepancy") > LOGP_TOLERANCE) & (S("logp_discrepancy_shifted") <= 0.01 * S("logp_discrepancy"))
         & RECORD_CONSISTENT,
         10, "fast", "critical", "actor",
         "Observations are stored one step off their actions in run {{ $labels.run_id }}",
         "The learner's log-probability of each behaviour action matches the actor's only when it reads the "
         "neighbouring step's observation: the rollout pairs observations with the wrong actions (an "
         "off-by-one when storing, or the reset observation stored in the wrong slot)."),
    # ------------------------------------------------------------- fast: plumbing
    Rule("RLSamplesDroppedStale", Increase(S("dropped_stale"), DROP_WINDOW) > 0, 0, "fast", "warning", "weight-sync",
         "Samples were dropped as stale in run {{ $labels.run_id }}",
         "Rollouts arrived older than --max-staleness learner steps and were thrown away: actors act with "
         "old weights. Check that new weights reach the actors, --rollouts-in-flight, and the learner's "
         "speed against the actors'."),
    # Held 30 updates: on a loaded 2-core machine a starved actor's batches lagged for several updates in a row
    # (pending on 2 of 3 healthy async runs at 10). The invariants weights_frozen and weights_as_stamped name
    # unpublished or unloaded weights first; this rule is the backstop for an actor stuck on an old network.
    Rule("RLStalenessBeyondQueues", S("staleness_batches") > S("queue_capacity") + 1, 30, "fast", "critical",
         "weight-sync",
         "Samples are staler than the queues can explain in run {{ $labels.run_id }}",
         "Finished rollouts are learned oldest first, so with actors of like speed a batch is learned at most "
         "as many updates after it was requested as there are batches queued ahead of it (one slow actor's "
         "batches lag more, but not every batch for 30 updates); here every batch was older still for 30 "
         "updates: actors keep acting with old weights (weights not published, not loaded, or an actor stuck on an old "
         "network).", after_updates=3),
    # Frozen weights, memory growing per sample and rollouts kept after learning are judged per update by the
    # pipeline invariants (weights_frozen, memory_per_sample, rollouts_retained: telemetry/invariants.py).
    # Every batch the learner takes was acted after the one before it: updates without new env steps re-learn.
    Rule("RLActorsStalled", (Delta(S("learner_steps"), 10) > 0) & Delta(S("env_steps"), 10).eq(0), 0,
         "fast", "critical", "throughput",
         "The learner steps while actors produce nothing in run {{ $labels.run_id }}",
         "Over the last 10 updates the learner kept training but no new env steps arrived: it re-learns old "
         "data while actors are stuck (a hung env step, actors waiting for weights)."),
    # The run's own twin of the live fleet rule RLActorSlow: the driver compares each Ray actor's speed with its
    # peers' from the counters on its rollouts (rlvitals/distributed/peers.py) and names the outliers on the row.
    Rule("RLActorSlowerThanPeers", S("actors_slow") > 0, 5, "fast", "warning", "throughput",
         "Ray actors step far slower than their peers in run {{ $labels.run_id }}",
         "The named actors' env steps per second of stepping and inference, over their last rollouts, are under "
         "half the median of the run's actors and more than 3 robust standard deviations (interquartile range / "
         "1.349) below it: their node is overloaded, their envs got slower, or they hit something their peers do "
         "not. Judged once 4 actors have a speed. Prometheus raises it as RLActorSlow, by instance and node.",
         names_key="actors_slow_named", live_twin="RLActorSlow"),
    # The run's twin of RLActorStalled: an actor that delivers nothing while its peers deliver, counted in their
    # rollouts (rlvitals/distributed/peers.py), so a slower machine names it after the same rollouts.
    Rule("RLActorSilentAmongPeers", S("actors_silent") > 0, 2, "fast", "warning", "throughput",
         "Ray actors deliver nothing while their peers do in run {{ $labels.run_id }}",
         "The named actors' newest rollout is more than 8 of their usual gaps behind (the larger of their own "
         "recent gap and one rollout of every actor's), counted in the rollouts their peers delivered since: "
         "they are stuck (an env step that never returns, a lost request, an actor waiting on something only "
         "it needs), or dead and not yet back. Judged once 4 actors have delivered. Prometheus raises it as "
         "RLActorStalled, by instance and node.",
         names_key="actors_silent_named", live_twin="RLActorStalled"),
    Rule("RLNonFiniteSamplesDropped", Increase(S("dropped_nonfinite"), DROP_WINDOW) > 0, 0, "fast", "warning", "env",
         "Non-finite values reached the learner in run {{ $labels.run_id }}",
         "Batches with NaN or inf observations or rewards, or updates that produced them, were dropped "
         "(the run's nonfinite.jsonl says where). Non-finite inputs come from the env; non-finite updates "
         "from the optimizer (a learning rate far too high)."),
    # ------------------------------------------------------------------ slow
    Rule("RLResidualVarianceStuckHigh", (S("residual_variance") > 0.9) & (Delta(S("learner_steps"), 100) > 0),
         SLOW_HOLD, "slow", "warning", "value",
         "The value net explains almost none of the targets' variance in run {{ $labels.run_id }}",
         "Var(targets - values) / Var(targets) stayed above 0.9 for 2,000 updates of training: the value net "
         "is not learning. Check the value loss and its coefficient, the rewards, and backprop into the "
         "value head."),
    Rule("RLAdvantagesNotMeanZero", Abs(S("advantage_mean")) > S("advantage_std"), SLOW_HOLD, "slow", "info",
         "returns",
         "Advantages stay off zero by more than their spread in run {{ $labels.run_id }}",
         "For 2,000 updates the advantages' mean has been larger than their standard deviation: the value "
         "net never catches up with the returns, or the advantage calculation is biased (a sign, a "
         "missing discount, a carry across episodes).", after_updates=100),
    # Memory per sample is judged per update (invariant memory_per_sample); this catches what creeps slower.
    Rule("RLMemoryCreeping",
         (Delta(S("rss_bytes"), 3 * SLOW_WINDOW) > 0.1 * S("rss_bytes").shifted(3 * SLOW_WINDOW))
         & (Delta(S("rss_bytes"), SLOW_WINDOW) > 0) & (Delta(S("rss_bytes").shifted(SLOW_WINDOW), SLOW_WINDOW) > 0)
         & (Delta(S("rss_bytes").shifted(2 * SLOW_WINDOW), SLOW_WINDOW) > 0), SLOW_WINDOW,
         "slow", "warning", "memory",
         "Resident memory keeps creeping up in run {{ $labels.run_id }}",
         "Memory grew by over 10% in 3,000 updates, in each of their three parts, and kept doing so for 1,000 "
         "updates more: a slow leak that will end a run of days. Look for caches and lists that grow with the "
         "number of updates or episodes."),
    Rule("RLKLGrowing",
         (S("kl") > 1.5 * S("kl").shifted(2 * SLOW_HOLD)) & (S("kl") - S("kl").shifted(2 * SLOW_HOLD) > 0.01),
         SLOW_HOLD, "slow",
         "warning", "weight-sync",
         "KL between behaviour and learner policy keeps growing in run {{ $labels.run_id }}",
         "The KL is more than 1.5 times (and 0.01 nats above) what it was 4,000 updates earlier, for 2,000 "
         "updates: the learner trains on ever older experience, or its updates grow. Check staleness, queue "
         "depth, epochs per batch and the learning rate."),
    Rule("RLThroughputDecaying",
         STEPS_PER_SECOND < 0.5 * STEPS_PER_SECOND_BEFORE, SLOW_HOLD, "slow",
         "warning", "throughput",
         "Env-step throughput fell to under half of what it was in run {{ $labels.run_id }}",
         "Env steps per second over the last 1,000 updates are under half of what they were 4,000 updates "
         "earlier, and stayed there for 2,000 updates: something accumulates (memory, log files, queues) or a "
         "node slowed down. Compare the actors' phase times and memory.", after_updates=100),
    # ------------------------------------------------------------------ live only
    # Progress that stopped leaves no row to judge: the clock is the only evidence of its absence.
    # It reads the fleet group's per-run rates (recorded once per interval), not every actor's counters twice.
    Rule("RLLearnerStalled",
         Live("(run:rlvitals_actor_env_steps:rate30s:median > 0) and on (run_id) "
              "(run:rlvitals_learner_steps:rate1m == 0)",
              ("rlvitals_actor_env_steps_total", "rlvitals_learner_steps_total")), 30,
         "fast", "critical", "throughput",
         "Actors produce samples but the learner takes no steps in run {{ $labels.run_id }}",
         "For half a minute the typical Ray actor kept stepping its envs while the learner took no optimizer "
         "step in the last minute: the learner process is alive but stuck or starved of its GPU. Look at its "
         "log and its phase times."),
    Rule("RLActorRestartingRepeatedly",
         Live("increase(rlvitals_actor_restarts_total[30m]) > 2", ("rlvitals_actor_restarts_total",)), 0,
         "slow", "warning", "actor",
         "Actors keep restarting in run {{ $labels.run_id }}",
         "More than two actor restarts in 30 minutes: an env that crashes, or actors killed for memory. "
         "Read the actors' logs (ray logs) and their memory."),
    Rule("RLGPUMemoryNearLimit",
         Live("rlvitals_gpu_memory_used_bytes / rlvitals_gpu_memory_total_bytes > 0.95",
              ("rlvitals_gpu_memory_used_bytes", "rlvitals_gpu_memory_total_bytes")), 300, "fast",
         "warning", "memory",
         "GPU {{ $labels.gpu }} memory above 95% in run {{ $labels.run_id }}",
         "The next allocation may fail. Compare torch's allocated and reserved memory: reserved >> "
         "allocated means the caching allocator, not your tensors."),
)



def invariant_rule(inv: Invariant) -> Rule:
    """The rule of an invariant: it fires as soon as the run's monitor counts the invariant as broken.

    The hold is counted in updates by the monitor (telemetry.invariants), so the rule itself waits for nothing.
    """
    return Rule(inv.rule_name, S(inv.broken_key) > 0, 0, "fast", inv.severity, inv.component,
                inv.summary + " in run {{ $labels.run_id }}", inv.check, update_key=inv.broken_key,
                value_key=inv.statistic, value_limit=inv.limit, names_key=inv.names_key, rank=STAGE_RANK[inv.name],
                alert_query=f'max by (run_id) ({INVARIANT_BROKEN_METRIC}{{invariant="{inv.name}"}}) > 0')


RULES = RULES + tuple(invariant_rule(inv) for inv in INVARIANTS)

# The fleet rules: one alert per run however many processes (RLComponentDown too), live only.
RULES += tuple(Rule(s.name, Live(s.query, s.reads), s.hold_seconds, "fast", s.severity, s.component, s.summary,
                    s.check) for s in FLEET)

BY_RULE: dict[str, Rule] = {r.name: r for r in RULES}
ROW_RULE_NAMES: tuple[str, ...] = tuple(r.name for r in RULES if not r.live_only and not r.alert_query)
"""The rules whose alert reads the health monitor's count (the label values of `rlvitals_rule_held_updates`)."""


def check_rules() -> None:
    """Every rule names a known component, severity and horizon (telemetry.catalogue checks the keys they read)."""
    for r in RULES:
        if r.component not in COMPONENTS or r.severity not in SEVERITIES or r.horizon not in HORIZONS:
            raise ValueError(f"rule {r.name}: bad component/severity/horizon")


check_rules()

