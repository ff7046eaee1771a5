"""The metric catalogue: every metric rlvitals exports, in one place.

Exporters, the metric reference page (docs/metrics.md), the dashboards and
the alert rules are generated from or checked against this list, so a metric
cannot exist in one of them and not the others.

Each entry says what is measured, what healthy looks like, and what it means
when it is not. `source` is the metric's key in the run's recorded rows
(metrics.jsonl), which the offline health evaluator and the report read; for
learner metrics it is also the key of the learner's per-batch statistics
(where a counter's entry is the batch's increment and the row holds the total).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .invariants import INVARIANTS
from .rules import EXTRA_ROW_KEYS, HELD_KEY, HELD_METRIC, INVARIANT_BROKEN_METRIC, ROW_RULE_NAMES, RULES

LEVELS = ("off", "minimal", "standard", "debug")
KINDS = ("counter", "gauge", "histogram", "info")
STATS = ("min", "max", "mean", "std")

TIMINGS_NOT_IN_ROWS = "timings differ in every repetition of a run, and rows are reproducible (`wall_seconds` aside)"

INVARIANT_NAMES = tuple(i.name for i in INVARIANTS)

STALENESS_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# Symmetric, roughly logarithmic: value-like quantities from -1000 to 1000.
SIGNED_BUCKETS = tuple(sorted({s * b for b in (0.01, 0.1, 0.3, 1, 3, 10, 30, 100, 300, 1000) for s in (-1, 1)} | {0.0}))


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str
    component: str
    """learner, actor, queue, process, gpu or run."""
    level: str
    """Lowest verbosity at which it is exported."""
    unit: str
    """Grafana unit id used by the dashboards (s, bytes, percentunit, short, none, celsius, watt, suffix:nats).
    percentunit only for fractions that stay within 0 to 1 (Grafana shows them as percentages); a ratio that can
    exceed 1 is `none`, shown as the plain number."""
    help: str
    labels: tuple[str, ...] = ()
    label_values: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """The closed set of values of each label (all labels are bounded by construction)."""
    source: str | None = None
    """Key of the value in the learner's statistics or the run's counters, and in metrics.jsonl rows unless
    `not_in_rows` says why not; with a label, a pattern such as 'value_{stat}'. None: live only."""
    not_in_rows: str = ""
    """Why `source` is not a metrics.jsonl key too (empty: it is one)."""
    buckets: tuple[float, ...] | None = None
    hardware: bool = False
    """Only has samples where the hardware exists (GPU); the family is always declared."""
    only_in: str = ""
    """The runs that have it, where not every run does (e.g. `recurrent policy`); counted per such run."""

    def at(self, level: str) -> bool:
        return LEVELS.index(level) >= LEVELS.index(self.level) and level != "off"


def _stats(name, component, level, unit, help, source):
    return Metric(name, "gauge", component, level, unit, help, labels=("stat",),
                  label_values={"stat": STATS}, source=source)


METRICS: tuple[Metric, ...] = (
    # ------------------------------------------------------------------ run
    Metric("rlvitals_run_info", "info", "run", "minimal", "none",
           "Identity of the run this process belongs to: run id, run name (the run directory's base name), env, "
           "algorithm, mode, code version. One series per process; use it to join metrics across components of "
           "the same run.",
           labels=("run_id", "run_name", "env", "algorithm", "mode", "code_version")),

    # -------------------------------------------------------------- learner
    Metric("rlvitals_learner_steps_total", "counter", "learner", "minimal", "short",
           "Optimizer steps taken (the network's age). Healthy: rises at a steady rate; a flat line means "
           "the learner is starved or stuck.", source="learner_steps"),
    Metric("rlvitals_learner_network_age", "gauge", "learner", "minimal", "short",
           "Current age of the learner's network in optimizer steps; every new sample is stamped with it "
           "(`policy_age` in rows: the age of the network that acted).",
           source="age"),
    Metric("rlvitals_learner_updates_total", "counter", "learner", "standard", "short",
           "Batches (rollouts) the learner has trained on.", source="updates"),
    Metric("rlvitals_learner_samples_consumed_total", "counter", "learner", "minimal", "short",
           "Distinct samples the learner received and learned from (reset transitions excluded). Healthy: "
           "close to the actors' env steps; a growing gap means samples are dropped or queued.", source="samples"),
    Metric("rlvitals_learner_samples_learned_total", "counter", "learner", "standard", "short",
           "Sample-gradient passes: each sample counts once per epoch it is learned in.", source="samples_learned"),
    Metric("rlvitals_learner_training_intensity", "gauge", "learner", "standard", "short",
           "Samples learned per sample collected. Healthy: steady, equal to the epochs per batch in "
           "synchronous mode; falling means actors out-produce the learner, rising means samples are reused.",
           source="training_intensity",
           not_in_rows="computed when scraped; in rows it is `samples_learned` / `actor_env_steps`"),
    Metric("rlvitals_learner_sample_staleness_steps", "histogram", "learner", "standard", "short",
           "Network age of each sample when it reaches the learner: learner steps between the network that "
           "produced it and the one learning from it. Healthy: a steady value (exactly 0 in synchronous local "
           "mode); rising staleness means actors lag the learner and on-policy learning degrades.",
           buckets=STALENESS_BUCKETS, source="staleness"),
    Metric("rlvitals_learner_relative_entropy_ratio", "gauge", "learner", "standard", "percentunit",
           "Policy entropy divided by the maximum possible entropy, on the learner's batch. Healthy: starts "
           "near 1, falls quickly, then flattens. Stuck near 1: no policy is being learned (check policy "
           "targets, backprop, the env). Near 0: the policy collapsed (add exploration or shrink rewards). "
           "Wild oscillation: learning rate too high. Discrete actions only have a maximum (log of the number "
           "of actions); for a Gaussian policy the divisor is a reference scale (the uniform distribution over "
           "a bounded box, else a unit Gaussian) that a wide policy exceeds: read the entropy change instead.",
           source="relative_entropy"),
    Metric("rlvitals_learner_entropy_change_nats", "gauge", "learner", "standard", "suffix:nats",
           "Mean policy entropy per action dimension on the learner's batch, minus its value on the run's first "
           "batch (the initial policy). Healthy: falls as the policy learns; a Gaussian policy may also widen "
           "(positive) on a task that rewards exploration. Far below 0 on a Gaussian policy (-4 nats: every "
           "standard deviation 55 times narrower than at the start): it stopped exploring.",
           source="entropy_change"),
    Metric("rlvitals_learner_entropy_bounded", "gauge", "learner", "standard", "none",
           "1 when the policy's distribution has a maximum entropy (discrete actions), so relative entropy "
           "near 1 means uniform; 0 for a Gaussian policy, whose entropy is unbounded. The health rules read "
           "it to judge each distribution family by its own measure.", source="entropy_bounded"),
    Metric("rlvitals_learner_kl_divergence_nats", "gauge", "learner", "standard", "suffix:nats",
           "KL(behaviour policy || learner policy) on the same batch, exact from stored action distributions. "
           "Healthy: small and positive. Very large: stale experience. Very small: the learning rate could "
           "go up. Growing steadily: old experience is being replayed. Negative is impossible here; a "
           "negative value would be a bug.", source="kl"),
    Metric("rlvitals_learner_residual_variance_ratio", "gauge", "learner", "standard", "none",
           "Var(value targets - values) / Var(value targets). Healthy: starts near 1, drops fast, then "
           "declines slowly. Stuck near 1: the value net is not learning (check rewards, value loss, "
           "backprop). Oscillating: learning rate too high. Absent (undefined) when the targets barely vary "
           "(std below 1% of r_max / (1 - gamma)), as on a plateau where every episode is truncated.",
           source="residual_variance"),
    Metric("rlvitals_learner_terminal_correlation", "gauge", "learner", "standard", "none",
           "Correlation between the value of the final state and the final reward, over terminal steps in the "
           "batch. Healthy (envs with large final rewards): rises from 0 to near 1. Stuck near 0 while other "
           "value signals look fine: reward-to-go near termination is wrong. Absent when undefined.",
           source="terminal_correlation"),
    Metric("rlvitals_learner_penultimate_terminal_correlation", "gauge", "learner", "standard", "none",
           "Correlation between the value one step before the end and the final reward. High terminal but low "
           "penultimate correlation: reward-to-go is not carried backwards.",
           source="penultimate_terminal_correlation"),
    _stats("rlvitals_learner_value_target", "learner", "standard", "none",
           "Value targets (V-trace) over the batch: min, max, mean, std. Healthy: inside +-r_max / (1 - gamma) "
           "for the env's reward scale r_max (rlvitals_learner_value_target_scale_ratio says how far); "
           "|targets| in the hundreds are fine for gamma 0.99 and +1 rewards. Beyond it: check discounting.",
           "target_{stat}"),
    _stats("rlvitals_learner_value", "learner", "standard", "none",
           "Value predictions over the batch: min, max, mean, std. Healthy: close to the value-target "
           "distribution; persistently different means the value net struggles. Negative values in an env "
           "with only positive rewards mean reward-to-go or the value net is broken.", "value_{stat}"),
    _stats("rlvitals_learner_advantage", "learner", "standard", "none",
           "Advantages before normalisation: min, max, mean, std. Healthy: spread on the reward's scale, mean "
           "small next to the spread once the value net has caught up; a mean that stays larger than the "
           "spread for many minutes means the advantage calculation or the value net is wrong.",
           "advantage_{stat}"),
    _stats("rlvitals_learner_reward", "learner", "standard", "none",
           "Rewards in the batch: min, max, mean, std. Compare with what the env should give; surprises "
           "here explain surprises everywhere else.", "reward_{stat}"),
    Metric("rlvitals_learner_update_step", "gauge", "learner", "standard", "none",
           "Parameter change made by one learner update (entering vs leaving the learner): abs-max and "
           "mean-square. Healthy: mean-square small (around 1e-3 at lr 1e-2) and abs-max small but well above "
           "it. Much smaller: raise the learning rate; much larger: expect instability.",
           labels=("stat",), label_values={"stat": ("absmax", "meansq")}, source="step_{stat}"),
    Metric("rlvitals_learner_gradient", "gauge", "learner", "standard", "none",
           "Gradient statistics per update before clipping: abs-max and mean-square over the update's first "
           "epoch (each sample seen once), global norm averaged over every minibatch. Use them when the step "
           "statistics look odd, to tell a gradient problem from an optimizer problem.",
           labels=("stat",), label_values={"stat": ("absmax", "meansq", "norm")}, source="grad_{stat}"),
    Metric("rlvitals_learner_gradient_noise_scale", "gauge", "learner", "standard", "short",
           "McCandlish & Kaplan simple gradient noise scale (EMA-smoothed): the batch size beyond which "
           "larger batches stop helping. Very noisy; read its long-run average.", source="grad_noise_scale"),
    Metric("rlvitals_learner_loss", "gauge", "learner", "standard", "none",
           "Loss terms averaged over the update's minibatches: policy (clipped surrogate), value, entropy "
           "(negative entropy). Healthy: fall early, then level out; a poor localiser of bugs on its own.",
           labels=("part",), label_values={"part": ("policy", "value", "entropy")}, source="{part}_loss"),
    Metric("rlvitals_learner_loss_direction", "gauge", "learner", "standard", "none",
           "Which way the loss moves each network output, read from its gradient (scale-free, on the "
           "update's first minibatch). policy: -dL/dlogp against the centred advantages, about 1 "
           "when healthy (exactly 1 on fresh samples); value: dL/dV against (V - target), the value coefficient; "
           "entropy: -dL/dH, the entropy coefficient. A correct loss can never read below 0 on any of them: "
           "negative is a sign error (advantages or ratio flipped, a value loss that ascends, an entropy "
           "bonus subtracted).",
           labels=("term",), label_values={"term": ("policy", "value", "entropy")}, source="{term}_loss_direction"),
    Metric("rlvitals_learner_gradient_mismatch_ratio", "gauge", "learner", "standard", "none",
           "Whether the gradient the optimizer steps with is this minibatch's: the value head's bias is added to "
           "every value, so its gradient must equal sum_i dL/dV_i; the difference as a fraction of sum_i "
           "|dL/dV_i|, on the update's first minibatch. Healthy: rounding (1e-7; about 1e-2 in bfloat16). Of "
           "order 1: gradients accumulate across steps (zero_grad missing or misplaced) or something else "
           "writes into the gradients.", source="gradient_mismatch"),
    Metric("rlvitals_learner_actor_weights_mismatch_ratio", "gauge", "learner", "standard", "none",
           "The weights that acted against the learner's weights of the network age the batch is stamped with: "
           "the relative difference of their fingerprints (float64 sums of the parameters, normaliser statistics "
           "and their squares), "
           "the largest over the batch's actors. Healthy: 0 (rounding, 1e-12, across devices). Above: actors "
           "act with other weights than the age they report (stale weights sent under a new age, weights "
           "received but not loaded).", source="weights_mismatch"),
    Metric("rlvitals_learner_behaviour_record_discrepancy_nats", "gauge", "learner", "standard", "suffix:nats",
           "The actors' record checked against itself: the largest |log mu(a; stored parameters) - stored log "
           "mu| over the batch. It needs no learner network, so it holds at any staleness. Healthy: 0 up to "
           "rounding; above it, the stored actions are not the ones acted with.", source="record_discrepancy"),
    Metric("rlvitals_learner_clip_fraction_ratio", "gauge", "learner", "standard", "percentunit",
           "Fraction of samples whose probability ratio left the PPO clip range. Healthy: below about 0.3 "
           "(small values such as 0.01 are fine late in a run). Persistently above 0.4: the policy moves too "
           "far per batch (lower lr or epochs) or samples are stale.",
           source="clip_fraction"),
    Metric("rlvitals_learner_head_gradient_norm", "gauge", "learner", "standard", "none",
           "Gradient norm of the policy head's and the value head's own parameters, before clipping, averaged "
           "over the minibatches of the update's first epoch. Exactly 0 means that head gets no gradient (a "
           "detached output, a loss term that does not reach it); healthy heads read well above 0 on every update.",
           labels=("head",), label_values={"head": ("policy", "value")}, source="grad_norm_{head}"),
    Metric("rlvitals_learner_reward_scale", "gauge", "learner", "standard", "none",
           "Largest absolute reward the learner has seen in this run: the scale every value-like signal is "
           "judged against, so one rule fits every env's reward scale.", source="reward_scale"),
    Metric("rlvitals_learner_observation_normalizer_samples", "gauge", "learner", "standard", "short",
           "Observations the running observation normaliser has merged (normalize_observations); 0 when it is "
           "off. Healthy: rises by every batch's samples; flat while training means its statistics are frozen.",
           source="obs_norm_samples"),
    Metric("rlvitals_learner_observation_normalizer", "gauge", "learner", "standard", "none",
           "The observation normaliser's running statistics, averaged over the observation's dimensions: "
           "abs_mean (|mean|) and std; 0 and 1 when it is off. Healthy: settle early and drift slowly; a std near "
           "0 means a constant input, and jumps mean the observations' distribution changes under the policy.",
           labels=("stat",), label_values={"stat": ("abs_mean", "std")}, source="obs_norm_{stat}"),
    Metric("rlvitals_learner_reward_divisor", "gauge", "learner", "standard", "none",
           "What the learner divides rewards by (normalize_rewards): the running std of each env's discounted "
           "return; 1 when reward scaling is off. With it on, the learner's reward, value, target and advantage "
           "statistics are in the scaled units, episode returns in the env's. Healthy: settles after the first "
           "batches; near 0 (sparse rewards not yet seen) scaled rewards sit at the clip.",
           source="reward_divisor"),
    Metric("rlvitals_learner_value_target_scale_ratio", "gauge", "learner", "standard", "none",
           "max|value target| x (1 - gamma) / reward scale. True values obey |V| <= r_max / (1 - gamma), so "
           "healthy targets read at most about 1 on any env. Well above 1: discounting, bootstrapping or "
           "reward accumulation is wrong.", source="value_target_scale"),
    Metric("rlvitals_learner_staleness_batches", "gauge", "learner", "standard", "short",
           "Staleness of the last batch in updates (learner steps / steps per update): how many batches the "
           "learner learned from since the network that produced it. Healthy: at most the rollouts queues "
           "can hold (rlvitals_queue_capacity); more means weights do not reach the actors.",
           source="staleness_batches"),
    Metric("rlvitals_learner_actor_inference_cost_ratio", "gauge", "learner", "standard", "none",
           "The last arriving rollout's inference phase per step over its actor's bare forward pass of the policy "
           "network on the same batch, both in CPU seconds of the actor's process (the forward pass: the fastest "
           "of its last few timings). Healthy: a small factor, 1.6 to 3.2 measured, up to 7 for a one-step "
           "bandit on a loaded machine (the phase also draws and checks the actions; a large network reads near "
           "1). Above 15: the actor does work per step that its network does not need.",
           source="actor_inference_cost_ratio"),
    Metric("rlvitals_learner_actor_env_step_cost_ratio", "gauge", "learner", "standard", "none",
           "The last arriving rollout's env-step phase per step over one step of a separate copy of the env as "
           "gymnasium builds it (none of the project's wrappers), both in CPU seconds of the actor's stepping thread "
           "(the copy's step: the cheapest of its last few timings). Healthy: near 1, 0.8 to 1.5 measured (the "
           "witness and the reward check add a few per cent). Above 2.5: the actor does work around each env step "
           "that the env does not need.", source="actor_env_step_cost_ratio"),
    Metric("rlvitals_learner_minibatch_cost_ratio", "gauge", "learner", "standard", "none",
           "The last update's minibatch phase per optimizer step over a forward, backward and optimizer step of a "
           "copy of the network (the learner's weights, a plain squared-error loss, the configured clip and Adam) on "
           "a minibatch of the configured size, both in CPU seconds of the learner (the copy's step: the cheapest "
           "of its last few timings). Healthy: 1.1 to 2.2 measured (the loss, running sums and sampled invariant "
           "checks on top). Above 4: work hidden in the minibatch step.", source="learner_minibatch_cost_ratio"),
    Metric("rlvitals_learner_rollouts_alive", "gauge", "learner", "standard", "short",
           "Rollouts this run holds in the learner process (created since the run began and not yet freed), "
           "read after each update. Healthy: small and flat (the batch in hand plus what queues hold); rising "
           "steadily means batches are being kept, long before the process's memory shows it.",
           source="rollouts_alive"),
    Metric("rlvitals_learner_actors_slow", "gauge", "learner", "standard", "short",
           "Ray actors far slower than their peers, as the driver sees them from the counters on their rollouts: "
           "env steps per second of stepping and inference under half the actors' median and 3 robust standard "
           "deviations below it (rlvitals/distributed/peers.py). Healthy: 0. Judged in Ray mode once 4 actors have "
           "a speed, 0 before that and in local mode; the row's actors_slow_named says which (RLActorSlowerThanPeers "
           "quotes it).",
           source="actors_slow"),
    Metric("rlvitals_learner_actors_silent", "gauge", "learner", "standard", "short",
           "Ray actors that deliver nothing while their peers deliver, as the driver counts rollouts: an actor "
           "whose newest rollout is more than 8 of its usual gaps behind, in rollouts its peers delivered since "
           "(rlvitals/distributed/peers.py). Healthy: 0. Judged in Ray mode once 4 actors have delivered, 0 "
           "before that and in local mode; the row's actors_silent_named says which (RLActorSilentAmongPeers "
           "quotes it).",
           source="actors_silent"),
    Metric("rlvitals_learner_logp_discrepancy_nats", "gauge", "learner", "standard", "suffix:nats",
           "Actor-learner consistency: on a batch whose staleness is 0, the largest |log pi_learner(a|x) - "
           "log mu_actor(a|x)| over its samples. The same network on the same observation gives the same "
           "number, so healthy reads 0 (up to float rounding). Above it, actors and learner see different "
           "data: preprocessing on one side only, or observations paired with the wrong step.",
           source="logp_discrepancy"),
    Metric("rlvitals_learner_logp_discrepancy_shifted_nats", "gauge", "learner", "standard", "suffix:nats",
           "The same discrepancy with the learner reading the neighbouring step's observation. Near 0 here "
           "while the unshifted discrepancy is not: observations are stored one step off their actions.",
           source="logp_discrepancy_shifted"),
    Metric("rlvitals_invariant_statistic", "gauge", "learner", "standard", "none",
           "Per update, how far each invariant is from holding (docs/invariants.md): 0 when it holds exactly, "
           "larger the more it is broken; a sampled check keeps its last value between measurements. Healthy: "
           "below the invariant's limit on every update.",
           labels=("invariant",), label_values={"invariant": INVARIANT_NAMES}, source="inv_{invariant}"),
    Metric(INVARIANT_BROKEN_METRIC, "gauge", "learner", "standard", "none",
           "0 while an invariant holds; once its statistic has been over its limit for its hold (counted in "
           "updates, never seconds), the update at which it broke, for the rest of the run. Healthy: 0 for every "
           "invariant. The `RLInvariant...` alert of the same name fires on it and names the component that owns "
           "the invariant.",
           labels=("invariant",), label_values={"invariant": INVARIANT_NAMES}, source="inv_broken_{invariant}"),
    Metric(HELD_METRIC, "gauge", "learner", "standard", "short",
           "Per health rule on the run's statistics (docs/health.md; invariants have their own flag), how many "
           "learner updates its condition has "
           "held without a break; -1 while it does not hold. Counted by the run's own health monitor on the "
           "evidence (updates), never in seconds, so a fast and a slow machine agree; the rule's alert fires when "
           "it reaches the rule's hold. Healthy: -1 for every rule but the info ones.",
           labels=("rule",), label_values={"rule": ROW_RULE_NAMES}, source=HELD_KEY,
           not_in_rows="the health monitor derives it from the rows, and replaying them gives it again"),
    Metric("rlvitals_learner_phase_seconds_total", "counter", "learner", "standard", "s",
           "Seconds the learner spent in each phase; the phases cover the whole learner loop, so they add up "
           "to its wall time. `wait`: fetching and unpacking rollouts (or, local mode, collecting them); "
           "`transfer`: to the device; `targets`: V-trace targets and the batch's statistics at arrival; "
           "`forward_backward` and `optimizer` (clipping, steps, running sums): the minibatch steps; "
           "`statistics`: the update's statistics copied to the host (on a GPU, where queued kernels are "
           "waited for); `publish`: weights handed to actors; `telemetry`, `rows`, `checkpoint`: recording; "
           "`bookkeeping`: counting, the non-finite guard, the rest. rate() gives the fraction of time per "
           "phase; a large `wait` share means the learner is starved by the actors, a large `publish` share "
           "means weight broadcasts are too big or too frequent.",
           labels=("phase",),
           label_values={"phase": ("wait", "transfer", "targets", "forward_backward", "optimizer", "statistics",
                                   "publish", "invariants", "telemetry", "rows", "checkpoint", "bookkeeping")},
           source="time_{phase}", not_in_rows=TIMINGS_NOT_IN_ROWS),
    Metric("rlvitals_learner_value_trace", "gauge", "learner", "debug", "none",
           "Value and reward along one recent trajectory of the batch (fixed length: the rollout). Healthy: "
           "values rise roughly exponentially toward rewards, then drop when a reward is collected.",
           labels=("series", "step"), label_values={"series": ("value", "reward")}),
    Metric("rlvitals_learner_layer_weight_rms", "gauge", "learner", "debug", "none",
           "Root-mean-square of each layer's weights. Healthy: stable; steady growth means no regularisation "
           "against exploding weights.", labels=("layer",)),
    Metric("rlvitals_learner_layer_gradient_rms", "gauge", "learner", "debug", "none",
           "Root-mean-square of each layer's gradient in the last minibatch. A layer near 0 while others are "
           "not is disconnected or saturated.", labels=("layer",)),
    Metric("rlvitals_learner_layer_activation_std", "gauge", "learner", "debug", "none",
           "Standard deviation of each activation layer's output on the batch. Near 0: the layer carries no "
           "information (dead or saturated units).", labels=("layer",)),
    Metric("rlvitals_learner_layer_dead_ratio", "gauge", "learner", "debug", "percentunit",
           "Fraction of units that are inactive for the whole batch (ReLU output 0, tanh saturated above "
           "0.99). Healthy: well below 0.5; rising means units are dying.", labels=("layer",)),
    Metric("rlvitals_learner_recurrent_state_rms", "gauge", "learner", "debug", "none",
           "Recurrent policies: root-mean-square of the policy core's hidden state each env's rollout began with "
           "(emptied where its first step begins an episode). Near 0 after training: the core carries nothing "
           "forward; growing without bound: the state is never reset.", source="recurrent_state_rms",
           only_in="recurrent policy"),
    Metric("rlvitals_learner_recurrent_gate_saturated_ratio", "gauge", "learner", "debug", "percentunit",
           "Recurrent policies: share of the policy core's gate units saturated (sigmoid within 0.01 of 0 or 1, the "
           "cell input's tanh within 0.01 of +-1) at each rollout's first step. Healthy: well below 0.5; near 1 the "
           "gates no longer respond to their inputs and the gradient through time vanishes.",
           source="recurrent_gate_saturated_ratio", only_in="recurrent policy"),
    Metric("rlvitals_learner_value_target_distribution", "histogram", "learner", "debug", "none",
           "Histogram of every value target learned from. Same reading as rlvitals_learner_value_target, "
           "with the shape visible.", buckets=SIGNED_BUCKETS),
    Metric("rlvitals_learner_advantage_distribution", "histogram", "learner", "debug", "none",
           "Histogram of every advantage before normalisation.", buckets=SIGNED_BUCKETS),

    # --------------------------------------------------------------- actors
    Metric("rlvitals_actor_env_steps_total", "counter", "actor", "minimal", "short",
           "Agent steps taken (reset transitions excluded). rate() is the actor throughput. Healthy: steady "
           "for the whole run; slow decay means something accumulates (memory, logging, queues).",
           source="env_steps"),
    Metric("rlvitals_actor_episodes_total", "counter", "actor", "minimal", "short",
           "Episodes finished.", source="episodes"),
    _stats("rlvitals_actor_episode_return", "actor", "minimal", "none",
           "Return of the last 100 finished episodes: min, max, mean, std. What you care about, but noisy "
           "and poor at localising errors.", "return_{stat}"),
    _stats("rlvitals_actor_episode_length", "actor", "minimal", "short",
           "Length (agent steps) of the last 100 finished episodes: min, max, mean, std. Every episode the "
           "same length in an env that should vary: a broken env or a degenerate policy.", "length_{stat}"),
    Metric("rlvitals_actor_solve_ratio", "gauge", "actor", "standard", "percentunit",
           "Fraction of the last 100 episodes the env reported as a success (`is_success`/`success` in info); "
           "absent for envs that do not report success.", source="solve_ratio"),
    Metric("rlvitals_actor_phase_seconds_total", "counter", "actor", "standard", "s",
           "Seconds actors spent in each phase; in Ray mode the phases add up to each actor's wall time since "
           "it started (a local run's collection is the learner's `wait` phase: only its env_step and "
           "inference show here). "
           "`env_step`: stepping envs; `inference`: the policy's forward pass; `weight_wait`: waiting for and "
           "loading new weights; `work_wait`: no request in hand (a finished rollout waits for the learner to "
           "ask for the next); `other`: start-up, the runner's packing and the actor's own telemetry. A large "
           "`work_wait` or `weight_wait` share means actors idle on the learner; a large `other` share, "
           "overhead outside the env and the policy.",
           labels=("phase",), label_values={"phase": ("env_step", "inference", "weight_wait", "work_wait",
                                                      "other")},
           source="time_{phase}", not_in_rows=TIMINGS_NOT_IN_ROWS),
    Metric("rlvitals_actor_network_age", "gauge", "actor", "minimal", "short",
           "Age of the network the actor acts with. Healthy: follows rlvitals_learner_network_age closely.",
           source="policy_age"),

    # ------------------------------------------------------ queues/transport
    Metric("rlvitals_queue_depth", "gauge", "queue", "minimal", "short",
           "Rollouts waiting between actors and the learner. Healthy: small and steady; always at capacity "
           "means the learner is the bottleneck; only growing means the learner stalls.",
           labels=("queue",), label_values={"queue": ("rollouts",)}, source="queue_depth"),
    Metric("rlvitals_queue_capacity", "gauge", "queue", "standard", "short",
           "Capacity of each queue (backpressure limit).", labels=("queue",), label_values={"queue": ("rollouts",)},
           source="queue_capacity"),
    Metric("rlvitals_samples_dropped_total", "counter", "queue", "minimal", "short",
           "Samples discarded before learning, by reason: `stale` (older than the staleness bound) or "
           "`nonfinite` (NaN or inf in the batch or its update). Healthy: flat; any `nonfinite` needs a look.",
           labels=("reason",), label_values={"reason": ("stale", "nonfinite")}, source="dropped_{reason}"),
    Metric("rlvitals_weight_publishes_total", "counter", "queue", "standard", "short",
           "Networks published to the actors (at most one per network age)."),
    Metric("rlvitals_weight_publish_bytes_total", "counter", "queue", "standard", "bytes",
           "Bytes of weights published to the actors (one copy per network age published)."),
    Metric("rlvitals_actor_restarts_total", "counter", "queue", "minimal", "short",
           "Actor processes restarted after a crash. Healthy: 0; repeated restarts need the actor's log."),

    # -------------------------------------------------------------- process
    Metric("rlvitals_process_resident_memory_bytes", "gauge", "process", "minimal", "bytes",
           "Resident memory of this process. Healthy: flat after warm-up; steady growth is a leak.",
           source="rss_bytes"),
    Metric("rlvitals_process_cpu_seconds_total", "counter", "process", "standard", "s",
           "CPU seconds used by this process; rate() is cores busy."),
    Metric("rlvitals_torch_memory_allocated_bytes", "gauge", "process", "standard", "bytes",
           "Tensor memory in use on each CUDA device (torch.cuda.memory_allocated).", labels=("device",),
           hardware=True),
    Metric("rlvitals_torch_memory_reserved_bytes", "gauge", "process", "standard", "bytes",
           "Memory torch's caching allocator holds on each CUDA device; allocated << reserved means caching, "
           "not your tensors, uses the memory.", labels=("device",), hardware=True),
    Metric("rlvitals_torch_memory_peak_allocated_bytes", "gauge", "process", "standard", "bytes",
           "Peak tensor memory on each CUDA device since start (torch.cuda.max_memory_allocated).",
           labels=("device",), hardware=True),
    Metric("rlvitals_torch_memory_peak_reserved_bytes", "gauge", "process", "standard", "bytes",
           "Peak memory held by torch's allocator (torch.cuda.max_memory_reserved).", labels=("device",),
           hardware=True),

    # ----------------------------------------------------------------- node
    Metric("rlvitals_node_memory_used_bytes", "gauge", "node", "minimal", "bytes",
           "Memory in use on the whole machine (total minus available). Healthy: well below "
           "rlvitals_node_memory_total_bytes; approaching it, the OS will start killing actors."),
    Metric("rlvitals_node_memory_total_bytes", "gauge", "node", "minimal", "bytes", "Memory of the machine."),
    Metric("rlvitals_node_cpu_utilization_ratio", "gauge", "node", "standard", "percentunit",
           "Fraction of the machine's CPU time in use since the previous scrape. Near 1 with low actor "
           "throughput: something else competes for the cores."),

    # ------------------------------------------------------------------ gpu
    Metric("rlvitals_gpu_memory_used_bytes", "gauge", "gpu", "standard", "bytes",
           "GPU memory in use as NVML reports it (all processes, including CUDA context). This is the figure "
           "that crashes the run when it reaches the total.", labels=("gpu",), hardware=True),
    Metric("rlvitals_gpu_memory_total_bytes", "gauge", "gpu", "standard", "bytes",
           "GPU memory capacity.", labels=("gpu",), hardware=True),
    Metric("rlvitals_gpu_utilization_ratio", "gauge", "gpu", "standard", "percentunit",
           "Fraction of time a kernel ran on the GPU. Persistently low on the learner's GPU: profile the "
           "input pipeline.", labels=("gpu",), hardware=True),
    Metric("rlvitals_gpu_temperature_celsius", "gauge", "gpu", "standard", "celsius",
           "GPU core temperature.", labels=("gpu",), hardware=True),
    Metric("rlvitals_gpu_power_watts", "gauge", "gpu", "standard", "watt",
           "GPU power draw.", labels=("gpu",), hardware=True),
    Metric("rlvitals_gpu_fan_ratio", "gauge", "gpu", "standard", "percentunit",
           "GPU fan speed as a fraction of its maximum (absent on fanless data-centre GPUs).",
           labels=("gpu",), hardware=True),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}


def _row_keys() -> dict[str, tuple[Metric, tuple[tuple[str, str], ...]]]:
    """Row key -> (catalogue metric, its label values), from each metric's `source` pattern."""
    out = {}
    for m in METRICS:
        if not m.source:
            continue
        if not m.labels:
            out[m.source] = (m, ())
            continue
        (label,) = m.labels  # every row-backed labelled metric has one closed label
        for value in m.label_values[label]:
            out[m.source.format(**{label: value})] = (m, ((label, value),))
    return out


ROW_KEYS = _row_keys()
"""Every key a catalogue metric is recorded from (metrics.jsonl keys, and the few `not_in_rows`), with the metric and
its labels."""


def _check_rule_keys() -> None:
    """Every health rule reads only keys the run records."""
    for rule in RULES:
        unknown = rule.condition.keys() - ROW_KEYS.keys() - set(EXTRA_ROW_KEYS)
        if unknown:
            raise ValueError(f"rule {rule.name} reads {sorted(unknown)}, which no catalogue metric records")


_check_rule_keys()


def metrics_at(level: str) -> list[Metric]:
    return [m for m in METRICS if m.at(level)]


def exposed_names(metric: Metric) -> list[str]:
    """Sample names as they appear in the exposition format (counters gain no suffix here)."""
    if metric.kind == "histogram":
        if min(metric.buckets) < 0:  # OpenMetrics: no _sum (nor _count) with negative buckets
            return [f"{metric.name}_bucket"]
        return [f"{metric.name}_bucket", f"{metric.name}_sum", f"{metric.name}_count"]
    return [metric.name]
