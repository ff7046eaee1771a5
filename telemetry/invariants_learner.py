"""The invariants of the learner's stages: dataflow into the loss, the optimisation step, and the
exported diagnostics against their recomputation.
"""

from __future__ import annotations

from .invariant_model import Invariant

LEARNER_INVARIANTS: tuple[Invariant, ...] = (
    # ----------------------------------------------------------------- what the learner received
    Invariant(
        "received_as_sent", "pipeline", "learner", 0.0, 1,
        "The learner's copy of a batch differs from the rollout it received",
        "A tensor the learner moved to its device (observations, actions, rewards, episode ends, validity, the "
        "behaviour record) or the positions of the valid samples is not what the rollout holds: the transfer "
        "rounds, casts, reorders or drops part of the batch, and every later stage learns from data no actor "
        "produced while the actors' own records stay right.",
        "On sampled updates, right after the transfer, each transferred tensor is compared with the rollout's "
        "own, element by element on the learner's device (NaN equal to NaN), and the valid positions with the "
        "rollout's valid mask. A copy is the same values: a correct learner reads 0."),
    Invariant(
        "learned_once", "pipeline", "learner", 0.0, 1,
        "The learner learns a batch it has already learned",
        "Part of the batch the learner is handed (a runner's rollout, known by its witness and sequence number) "
        "was learned by an earlier learn step: a retry, a queue that hands a rollout twice or a loop that calls "
        "the learner again on the same batch. The samples count once and train twice, so the training "
        "intensity, staleness and every per-sample statistic read wrong.",
        "Every update: each witness record the batch carries names the witness that wrote it (random per runner) "
        "and its sequence number there, which rises by one per rollout; the learner keeps the last 256 of each "
        "and counts the batch's records it has seen. Each rollout arrives once in a correct run: 0."),
    # ----------------------------------------------------------------- the network's age, which stamps every sample
    Invariant(
        "network_age_counted", "pipeline", "learner", 0.0, 1,
        "The learner's network age or a batch's staleness is not what its optimizer steps say",
        "The network's age (the version every published weight and every sample is stamped with) rose over "
        "an update by another number than the optimizer's own step counters did, or a batch's staleness is not "
        "the age at its arrival less the age stamped on it: ages are counted per update instead of per step, "
        "twice, or from the wrong rollout, so staleness, the weights' versions and every rule gated on fresh "
        "samples read wrong.",
        "Every update, in whole numbers: |(age after - age before) - the rise of Adam's per-parameter step "
        "counters over the update| (NaN for an optimizer that keeps none, or on an update whose optimizer state "
        "was restarted after a non-finite batch) and |staleness - (age at arrival - the rollout's stamped "
        "age)|, the larger. A correct learner counts one age per optimizer step: 0."),
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
    Invariant(
        "policy_loss_as_configured", "dataflow", "policy", 0.05, 2,
        "The policy loss is not the clipped surrogate with the configured clip range",
        "Over the update's steps, the mean policy loss differs from the clipped surrogate recomputed at the "
        "ratios each step stepped with, with the run's configured clip range and advantage normalisation: the "
        "loss clips at another range (a setting handed to the learner wrong, a hard-coded range), clips the "
        "ratio's other side, or reports a surrogate other than the one it steps with. The first minibatch's "
        "gradient check cannot see a clip range: its ratios are 1.",
        "On sampled updates, -mean_steps mean_i min(r_i A_i, clip(r_i) A_i) in float64 from each step's kept "
        "policy parameters, the rollout's actions and behaviour log-probabilities and the batch's advantages "
        "(normalised per minibatch as configured), against the loss's reported mean. Statistic |loss - ref| / "
        "max(|ref|, 1e-3 mean|r A|): float32 agrees to about 1e-6 of that scale, limit 0.05. Not measured under "
        "bfloat16 autocast or where the advantages barely vary."),
    Invariant(
        "distribution_as_defined", "dataflow", "policy", 1e-3, 2,
        "The action distribution's log-probabilities, entropy or KL are not the distribution's",
        "The formula that the actor records with and the learner trains with (learner/networks.py) gives other "
        "log-probabilities, entropies or KL divergences than torch.distributions on the same parameters. Actor "
        "and learner agree with each other through it, so the actor's record and the exported diagnostics read "
        "through a wrong formula: those checks wait while this one is broken, and the formula is named.",
        "On sampled updates the product's log pi(a|x) of every behaviour action, its entropy and KL(mu || pi) "
        "are recomputed in float64 by torch.distributions (Categorical from logits, a diagonal Normal from mean "
        "and log std). Statistic: the largest |product - reference| / max(|reference|, 1 nat); float32 agrees "
        "to about 1e-6, so 1e-3 has no false alarm."),
    Invariant(
        "value_loss_inputs", "dataflow", "value", 1e-6, 2,
        "The value loss is handed other targets than the returns computed",
        "The targets the value loss trains on are not a copy of the returns stage's output for those samples: "
        "the hand-over between the returns and the value loss (flattening, indexing, a stale or scaled copy) "
        "changed them, while the returns themselves are right.",
        "On sampled updates the minibatch targets are compared with the returns' output at the valid samples, "
        "flattened apart. Both are exact copies of one tensor, so any difference over 1e-6 of the targets' "
        "scale is not rounding."),
    Invariant(
        "policy_loss_inputs", "dataflow", "policy", 1e-6, 2,
        "The policy loss is handed other advantages, actions or behaviour records than the batch's",
        "The advantages, actions, behaviour log-probabilities or distribution parameters the policy loss "
        "trains on are not copies of the returns' advantages and the rollout's records for those samples: the "
        "hand-over into the policy loss changed them.",
        "As value_loss_inputs, for the advantages (against the returns' output) and the actions, behaviour "
        "log-probabilities and parameters (against the rollout as it arrived): exact copies, limit 1e-6."),
    Invariant(
        "value_head_affine", "dataflow", "value", 0.05, 2,
        "The values do not move one for one with the value head's bias",
        "The value head's output is not affine in its last layer: a squashing or clipping of the values "
        "(tanh, a clamp, a scale that depends on the values) keeps them from reaching targets outside its "
        "range, and the value loss's gradient vanishes as they saturate.",
        "On sampled updates' first minibatch, mean_i dV_i/db over the minibatch for the value head's output "
        "bias b, by one extra autograd pass on the kept graph. V = w.h + b gives exactly 1 per sample, so the "
        "statistic |mean - 1| is 0 in float32 and under 0.01 with bfloat16 autocast: limit 0.05."),
    Invariant(
        "observation_statistics_recomputed", "dataflow", "preprocessing", 1e-6, 2,
        "The observation normaliser's statistics are not those of the raw observations",
        "With observation normalisation on, the running count, mean and variance after a batch are not the "
        "statistics before it merged with the batch's raw observations: the normaliser is fed other "
        "observations (already normalised ones, another batch's, part of the batch) or merges them wrongly. "
        "Actor and learner normalise alike with the wrong numbers, so nothing else disagrees.",
        "On sampled updates a float64 merge written apart (learner/invariants/preprocessing.py, shifted by the "
        "previous mean) recomputes the statistics from the copy taken before the batch and the rollout's valid "
        "observations as they arrived (rows beyond 1e30 or non-finite left out, as declared). Statistic: the "
        "largest relative gap in count, mean (in standard deviations) and variance; both sides are float64 of "
        "the same sums, about 1e-12 apart: limit 1e-6."),
    Invariant(
        "reward_scaling_recomputed", "dataflow", "preprocessing", 1e-4, 2,
        "The scaled rewards are not the raw ones over the running spread of the returns",
        "With reward normalisation on, the rewards the returns are computed from are not the raw rewards "
        "divided by the running standard deviation of the discounted returns (this batch's merged in) and "
        "clipped as configured: the divisor comes from other statistics, is stale, or the scaling is applied "
        "twice or with another clip.",
        "On sampled updates a float64 merge written apart recomputes the variance from the scaler's copy "
        "before the batch and the batch's discounted returns at valid steps (non-finite ones left out), then "
        "the scaled rewards from the raw ones. Statistic: max|scaled - reference| / max|reference| over valid "
        "steps; float32 rounding of one division is about 1e-7: limit 1e-4."),
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
        "updates, those that the reference Adam step of the first minibatch (optimizer_step_as_configured) moves "
        "beyond float32 rounding and that did not change at all over the update: later steps would have to undo "
        "that step exactly; exact, so no false alarm. A converged run whose steps round away in float32 (gradients "
        "near 1e-9 against Adam's epsilon) moves nothing and is not judged. The 'did not change' part is not judged "
        "while the learning rate is 0 (the statistic is then the missing count where there is one, else not "
        "measured)."),
    Invariant(
        "optimizer_step_as_configured", "optimisation", "optimizer", 1e-3, 2,
        "The optimizer's step is not Adam's with the configured hyperparameters",
        "From the same parameters, gradients, moments and learning rate, Adam with the configured betas and "
        "epsilon takes another step than the one taken: another optimizer or other hyperparameters, a step "
        "scaled inside the optimizer while its learning rate reads right, moments not updated, or a parameter "
        "changed without a gradient.",
        "On each sampled update's first minibatch the parameters, clipped gradients, Adam's moments and step "
        "counts and each group's learning rate are copied before the step; a float64 Adam written apart "
        "(learner/invariants/optimizer_step.py) gives the expected step. Per element the step taken may differ "
        "by 4 float32 ulps of the parameter plus 1e-5 of the step's magnitude (moments computed from |m| and |g|, "
        "so cancellation is allowed for); the statistic is the norm of the excess over the norm of the "
        "magnitudes, exactly 0 in a correct learner whatever the gradient's size, steps that round away "
        "included. Limit 1e-3."),
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
        "On a sampled batch, a diagnostic the learner exported (residual variance, entropy and its change "
        "from the initial policy, KL, clip fraction, the value, target, advantage and reward distributions, "
        "the terminal correlations, the value-target scale, the gradient's norm, abs-max, mean square and "
        "heads' norms, the value and entropy loss terms) differs from a slow float64 recomputation from "
        "the same tensors: the diagnostic itself is broken (arguments swapped, wrong mask, wrong "
        "distribution, a wrong pairing or bound).",
        "On sampled updates, float64 code of its own recomputes from the same tensors: min, max, mean and std "
        "of values, targets, advantages and rewards over valid steps; residual variance; relative entropy and "
        "the change of the entropy per action dimension from the initial policy's (taken by the check itself "
        "from the run's first batch); the terminal and penultimate terminal correlations (judged where both "
        "inputs spread beyond float32's rounding); the value-target scale against the learner's r_max; the "
        "KL (from the last epoch's minibatch parameters) and the clip fraction (every step's); and each step's "
        "statistics as the step is taken, from the parameters' own gradients before the clip: the global "
        "gradient norm (every step), the gradient's abs-max, mean square and each head's norm (first epoch), "
        "the value loss from the step's values and the returns' targets, the entropy term (not under bfloat16 "
        "autocast, whose loss terms round at 1e-2). Statistic: the "
        "largest |exported - reference| / max(|reference|, floor), floors 0.01 (residual variance, relative "
        "entropy, entropy change in nats, correlations, target scale), 0.1 (clip fraction), 1e-3 nats (KL), "
        "1% of |mean| + std (a distribution's statistics), none for the gradient's statistics (relative to "
        "their own size: a converged run's tiny gradients are exact too), 1e-5 for the value loss; undefined "
        "on one side only counts 1. float32 "
        "against float64 differs by about 1e-6 of these; the clip fraction's samples within 1e-4 of the clip "
        "boundary, which float32 may count on either side, are slack (before: 6.2e-4 on a healthy run from one "
        "such sample; healthy runs now read at most 1e-4). The clip fraction "
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
    Invariant(
        "exported_as_computed", "telemetry", "telemetry", 0.0, 2,
        "A metric a scrape reads is not the value the run computed",
        "Right after the metrics took an update's statistics, a learner gauge read back as Prometheus scrapes "
        "it differs from the value it was set from, or, right after a rollout was recorded, an actor gauge "
        "(network age, the episode return and length statistics) differs from the rollout's stamp or the last "
        "100 episodes, or a counter rose by another amount than the run counted: the exporter files a value "
        "under another metric or label, scales, converts, caches or "
        "drops it. Rows, verdicts and the learning are right; the dashboards and alerts show something else.",
        "On sampled updates, every learner gauge fed from an update's statistic (the catalogue's `source`) is "
        "read through the same collector the /metrics endpoint serves and compared with the statistic; in the "
        "process that records rollouts (local mode), the actor's network-age gauge with the rollout's stamped "
        "age and its episode gauges with the min, max, mean and std of the last 100 finished episodes, a "
        "window the check keeps itself; and between two reads, each learner counter (optimizer steps, updates, "
        "samples consumed and learned) and actor counter (env steps, episodes) rises by the sum of what the "
        "run computed for it in between. A float set and read back is the same float, and counts are whole, "
        "so the comparison is exact. Statistic: the larger share, learner's or actor's, of the compared "
        "series that differ, judged "
        "on the next update; NaN at verbosity off (nothing exported) or where no "
        "statistic was finite (telemetry/exported.py)."),
)
