"""The invariants of what the actors hand over: sampling (the actor's draws and records) and the
boundary (what the learner trains on is what the env emitted, under the declared rules).
"""

from __future__ import annotations

from .invariant_model import Z_LIMIT, Invariant

ACTOR_INVARIANTS: tuple[Invariant, ...] = (
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
        "neighbouring step, and the actor did not act on it: it was changed between the actor and the learner "
        "(a scaling, normalisation or dtype applied on one side only). Apply the same preprocessing where the "
        "actor acts and where the learner learns, or neither. (Changed before the actor acted: "
        "observations_changed_before_acting.)",
        "The witness keeps the env's own observation at sampled positions; a correct pipeline stores it "
        "unchanged (float32 rounding compared exactly, so a healthy run reads 0). A stored value found at the "
        "neighbouring step instead is a pairing fault and counts under boundary_observations."),
    Invariant(
        "acted_with_its_network", "boundary", "actor", 1e-4, 2,
        "Actors act with something other than their policy network on the observations they store",
        "The behaviour parameters an actor recorded are not what its own network gives on the observation "
        "stored with them: it acted with another function (a fallback or fixed policy everywhere, another "
        "copy of the network), on an observation changed for acting only, or on another step's observation. "
        "Its record agrees with its draws, so the sampling checks pass, and the learner disagrees with it "
        "downstream.",
        "On each runner's first 16 rollouts and every 16th after, the runner runs its network again on 32 "
        "stored observations (no draw, no grad, the weights it acted with) and compares with the recorded "
        "parameters: largest |recomputed - recorded| / max(1, |recorded|). Rows acted on with the fallback "
        "policy (unsafe observations, non-finite outputs) are left out; recurrent policies and probe agents "
        "are not judged. Another batch size rounds float32 sums differently by about 1e-7: limit 1e-4."),
    Invariant(
        "observations_changed_before_acting", "boundary", "actor", 1e-6, 2,
        "The actor changes the env's observations before acting on them",
        "The observation the rollout holds for a step is not the one the env emitted there, and the actor acted "
        "on the changed one (the learner reproduces its log-probabilities there exactly): the actor altered "
        "what the env returned before using and storing it (a lossy dtype, a clip, a scale no preprocessing "
        "declares). Policy and learner agree with each other on the wrong input.",
        "The witness keeps the env's own observation at sampled positions; where it differs from the stored one, "
        "a batch of staleness 0 tells where the change was made: the learner's log-probabilities at the stored "
        "observations equal the actor's (at most 1e-5 nats apart; 0 on a CPU learner) only if the actor acted "
        "on them. Then the gap counts here, else under observations_transformed; NaN when the batch is stale. "
        "Exact comparisons: a healthy run reads 0."),
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
        "env_time_limit", "boundary", "env", 0.0, 2,
        "The env's time limit truncates at another step than it declares",
        "The env's TimeLimit wrapper (gymnasium's, from the max_episode_steps its spec or its make call declares) "
        "truncated an episode before its count since the reset reached the limit, while the env below it did "
        "not truncate, or let an episode reach the limit untruncated: the env breaks its own contract (a "
        "step counter not reset with the episode, a limit counted in other steps). Look at the env's reset and "
        "at what its TimeLimit wraps.",
        "gymnasium's TimeLimit returns truncated = the inner env's truncated OR (steps since its reset >= "
        "max_episode_steps). Probes directly under and over each sub-env's TimeLimit (actors/time_limit.py) count "
        "the steps and resets it passes down and read the inner env's flag, so they re-derive its decision from "
        "its own inputs: integers and flags compared exactly, no false alarm. Truncations the env makes for its "
        "own reasons are below the TimeLimit and never judged. Not measured (NaN) on an update without a "
        "time-limit decision, nor for envs without gymnasium's TimeLimit (vector entry points such as "
        "CartPole's, ALE's native vector env)."),
    Invariant(
        "env_reset_restores", "boundary", "env", 0.0, 2,
        "The env's reset does not restore its state: a fresh instance replays its episodes differently",
        "An episode one of the run's envs played after others, replayed by a fresh instance of the same env "
        "(given the generator state the run's env reset from, and the same actions), returned other "
        "observations, rewards or episode ends, while two fresh instances agree with each other: the env "
        "carries state across reset() (a step counter of its own time limit not reset, so every later episode "
        "is cut short; a resource, a cached observation, a generator not reseeded). Look at what the env's "
        "reset() leaves as it was.",
        "A correct env's reset restores its whole state: an episode follows from the state reset draws from "
        "the env's np_random and from the actions alone. The witness copies, for sampled episodes of one "
        "sub-env at a time, its generator just before the autoreset, the actions and what the env returned; "
        "in the actor's process a fresh instance built from the same spec is reset, given that generator "
        "state, reset as the autoreset did and stepped with the same actions (actors/reset_replay.py). The "
        "same functions of the same inputs in one process give identical values, compared exactly: no false "
        "alarm. An env whose episodes do not follow from their inputs (the global generator, the clock, a "
        "generator of its own seeded by reset(seed=...)) is told apart first: on a difference a second fresh "
        "instance, reset with another seed before it is given the same state, replays it too, and where the "
        "two disagree the env is not judged for the rest of the run. Not measured (NaN) on updates without a "
        "replay, nor for envs without sub-envs (vector entry points such as CartPole's, ALE's native vector "
        "env). Steps replayed stay under 1,024 plus 1/512 of the steps taken."),
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
    Invariant(
        "running_returns_recomputed", "boundary", "actor", 1e-5, 2,
        "The discounted returns the actor carries do not follow from its rewards and episode ends",
        "With reward normalisation on, the running discounted return each env's actor keeps (whose spread "
        "scales the rewards) is not gamma times the previous one plus the stored reward, reset at every "
        "episode end: a return not reset, another discount, or returns of other rewards than those stored.",
        "On sampled updates the learner recomputes R_t = gamma R_{t-1} + r_t (0 carried after an episode end, "
        "R unchanged on a reset transition) from the stored values for every step after a rollout's first, "
        "whose carry is the previous rollout's. The actor keeps R in float64 and stores float32, so the "
        "recursion differs by about 1e-7 of the returns' scale: limit 1e-5."),
)
