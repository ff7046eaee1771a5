"""The boundary statistics: a rollout as it arrives against the witness's records of raw env output.

`boundary_statistics` compares the rollout with the `WitnessRecord`s it carries (actors/witness.py)
wherever the rollout is learned from.

Statistics (row keys; 0 when the invariant holds, larger when broken, NaN
when the update had nothing to compare: no episode end for the episode-end
statistic, no reset step for the reset statistic; absent when the rollout
carries no witness record):

inv_boundary_actions
    Fraction of witnessed (t, env) positions whose stored action, mapped the
    way the runner maps it for the env (clipped to the Box bounds for
    continuous actions), differs from the action the env received.
    Derivation: the runner stores the action it sampled and steps the env
    with that action (clipped); both are the same float32 or integer values,
    so equality is exact. The witness copies the action as the step returns
    (cheaper than before it; the runner cannot act during the step). False
    alarms: none (exact comparison), unless an env writes into the action
    array it is given.

inv_boundary_rewards
    Largest relative difference |stored - env| / max(|env|, 1e-30) over all
    positions, the env's reward first rounded to float32 as storing rounds
    it (equal non-finite values count as equal, unequal ones as 1).
    Derivation: the stored reward is the env's reward rounded to float32;
    rounding the witnessed one the same way makes the comparison exact, so a
    correct run reads 0. False alarms: none (a difference of even one float32
    ulp, 6e-8 relative, is a changed reward; the limit of 1e-6 ignores those).

inv_boundary_episode_ends
    Number of terminated plus truncated flags that differ from the env's.
    Derivation: the flags are copied. False alarms: none (exact).

inv_boundary_observations
    Largest relative difference between the rollout's obs[t, env] and the
    observation the env emitted before step t (obs[T]: after the last step)
    at 4 random positions per rollout, the emitted one rounded to the
    rollout's dtype. Derivation: the runner stores the emitted observation
    cast to float32 (pixels stay uint8); rounded the same way they are equal,
    so a correct run reads 0. False alarms: none (exact). Detection: a fault that
    changes a fraction f of positions is seen with probability
    1 - (1 - f)^4 per rollout; observations stored a step off or transformed
    (f near 1) are seen on the first rollout.

inv_boundary_resets
    Number of steps that follow a done (terminated or truncated, as the env
    returned them) of the same env, i.e. NEXT_STEP reset transitions, that
    the rollout marks valid. The witness carries the done of each env's last
    step into the next rollout. Derivation: in NEXT_STEP autoreset the step
    after a done only resets the env; its reward and action have no meaning.
    False alarms: none (exact).

inv_boundary_step_count
    |env steps the witness saw - the rollout's steps (T x envs)| + |agent
    steps the witness saw (steps that are not resets) - the rollout's
    env_steps (its valid count, what the run's step accounting adds up)|.
    Derivation: both count the same steps. False alarms: none (exact).

inv_observation_space
    Fraction of emitted observations (one per env per step) that are not in
    the env's declared observation space: another dtype (kind for Discrete)
    or shape, a value outside the Box bounds (NaN is outside, as in
    gymnasium's `contains`), or outside a Discrete's range. Checked on the
    raw output, before the runner casts it. Derivation: a correct env's
    observations are members of its observation space. False alarms: envs
    whose declared bounds are conventions rather than guarantees; the limit
    (1% for 5 updates in a row) tolerates rare excursions.

inv_env_time_limit
    Time-limit decisions against gymnasium's TimeLimit contract, counted by
    probes on both sides of each sub-env's TimeLimit (actors/time_limit.py
    has the derivation); NaN when no decision was seen.

inv_observations_changed_before_acting
    inv_observations_transformed's gap where the actor acted on the observations it stored: on a batch of
    staleness 0 the learner reproduces the actor's log-probabilities at the stored observations (a
    discrepancy of at most ACTED_ON_STORED; exactly 0 on a CPU learner), so the change was made where the actor
    reads the env's output, before acting and storing (the actor's), not between the actor and the learner
    (preprocessing, where the learner's log-probabilities at the changed observations differ from the actor's).
    `split_observation_change` moves the gap there; NaN where it cannot tell (no staleness-0 comparison).

inv_env_reset_restores
    Sampled episodes of the run's sub-envs whose replay on a fresh instance (the same generator state at the
    autoreset, the same actions) returned other transitions: the env carries state across its reset
    (actors/reset_replay.py has the derivation); NaN when no episode was replayed. Not in STATISTICS: envs
    without sub-envs (vector entry points) are never judged.
"""

from __future__ import annotations

import numpy as np

TINY = 1e-30
ACTED_ON_STORED = 1e-5
"""Nats: the learner's log-probabilities at the stored observations reproduce the actor's (same weights, same
inputs: 0 on a CPU learner, float32 rounding across devices), so the actor acted on what it stored."""


STATISTICS = ("inv_boundary_actions", "inv_boundary_rewards", "inv_boundary_episode_ends", "inv_boundary_observations",
              "inv_observations_transformed", "inv_observations_changed_before_acting", "inv_boundary_resets",
              "inv_boundary_step_count",
              "inv_observation_space", "inv_env_time_limit")


def relative_difference(stored: np.ndarray, witnessed: np.ndarray) -> np.ndarray:
    """|stored - witnessed| / max(|witnessed|, 1e-30), elementwise, with the witnessed value first rounded to
    the stored dtype (what storing does to it); equal values (NaN, inf included) give 0, unequal non-finite 1."""
    stored = np.asarray(stored)
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = np.asarray(witnessed).astype(stored.dtype)
    s, w = stored.astype(np.float64), rounded.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(s - w) / np.maximum(np.abs(w), TINY)
    same = (s == w) | (np.isnan(s) & np.isnan(w))
    return np.where(same, 0.0, np.where(np.isfinite(diff), diff, 1.0))


def _max(values: np.ndarray) -> float:
    return float(values.max()) if values.size else 0.0


def boundary_statistics(rollout) -> dict[str, float]:
    """The boundary statistics (module docstring) of a rollout against its witness records; {} if it has none.

    Positions are compared over the steps both have (a rollout with a step missing or added is the
    step count's to report, not every later position's)."""
    records = [r for r in getattr(rollout, "witness", ()) or () if r.complete]
    if not records:
        return {}
    T = rollout.num_steps
    acts = rollout.actions.numpy()
    rewards = rollout.rewards.numpy()
    term, trunc, valid = rollout.terminated.numpy(), rollout.truncated.numpy(), rollout.valid.numpy()
    obs = rollout.obs.numpy()
    reward_diff = 0.0
    positions = action_diff = ends = resets = steps = agent_steps = 0
    obs_diff = obs_transformed = 0.0
    end_events = reset_events = obs_compared = 0
    outside = emitted = limit_decisions = limit_wrong = replays = replays_differ = 0
    for rec in records:
        envs = slice(rec.env_offset, rec.env_offset + rec.num_envs)
        t = min(T, rec.rewards.shape[0])
        stored = acts[:t, envs]
        if rec.action_low is not None:
            stored = np.clip(stored, rec.action_low, rec.action_high)
        elif rec.action_start:
            stored = stored + rec.action_start
        witnessed = rec.actions[:t]
        differ = relative_difference(stored, witnessed) > 0   # exact: any difference at all
        action_diff += int(differ.reshape(t, rec.num_envs, -1).any(-1).sum())
        positions += t * rec.num_envs
        reward_diff = max(reward_diff, _max(relative_difference(rewards[:t, envs], rec.rewards[:t])))
        env_term, env_trunc, env_resets = rec.terminated[:t], rec.truncated[:t], rec.resets[:t]
        ends += int((term[:t, envs] != env_term).sum() + (trunc[:t, envs] != env_trunc).sum())
        end_events += int((term[:t, envs] | trunc[:t, envs] | env_term | env_trunc).sum())
        resets += int((valid[:t, envs] & env_resets).sum())
        reset_events += int(env_resets.sum())
        steps += rec.steps
        agent_steps += rec.agent_steps
        for (ts, e), seen in zip(rec.obs_at.tolist(), rec.obs, strict=True):
            if ts <= T:
                obs_compared += 1
                column = rec.env_offset + e
                gap = _max(relative_difference(obs[ts, column], seen))
                # The env's observation stored in a neighbouring slot is a pairing fault (the actor's); one that
                # is stored nowhere near, changed, is a transform between env and learner (preprocessing).
                paired_elsewhere = gap > 0 and any(
                    _max(relative_difference(obs[other, column], seen)) == 0
                    for other in (ts - 1, ts + 1) if 0 <= other <= T)
                if paired_elsewhere or gap == 0:
                    obs_diff = max(obs_diff, gap)
                else:
                    obs_transformed = max(obs_transformed, gap)
        outside += rec.outside_space
        emitted += rec.emitted
        limit_decisions += rec.limit_decisions
        limit_wrong += rec.limit_wrong
        replays += rec.reset_replays
        replays_differ += rec.reset_replays_differ
    covered = sum(rec.num_envs for rec in records)
    # A batch with an unwitnessed part (a runner without a witness) is compared on its witnessed envs only.
    claimed = rollout.env_steps if covered == rollout.num_envs else sum(
        int(valid[:, rec.env_offset:rec.env_offset + rec.num_envs].sum()) for rec in records)
    step_count = abs(steps - T * covered) + abs(agent_steps - claimed)
    nan = float("nan")
    # Where there was nothing to compare (no episode ended, no reset step) the update measured nothing: NaN,
    # so that a fault seen only at episode ends is judged on the updates that hold some, in a row.
    return {
        "inv_boundary_actions": action_diff / positions if positions else nan,
        "inv_boundary_rewards": float(reward_diff) if positions else nan,
        "inv_boundary_episode_ends": float(ends) if end_events else nan,
        "inv_boundary_observations": float(obs_diff) if obs_compared else nan,
        "inv_observations_transformed": float(obs_transformed) if obs_compared else nan,
        "inv_boundary_resets": float(resets) if reset_events else nan,
        "inv_boundary_step_count": float(step_count),
        "inv_observation_space": outside / emitted if emitted else nan,
        "inv_env_time_limit": float(limit_wrong) if limit_decisions else nan,
        "inv_env_reset_restores": float(replays_differ) if replays else nan,
    }


def split_observation_change(transformed: float, consistency: float) -> dict[str, float]:
    """Where an observation change between the env and the rollout was made, from the actor-learner consistency at
    staleness 0 (`consistency`: the learner's largest |log pi - log mu| at the stored observations, NaN when the
    batch is stale): made before acting (the actor's) when the actor acted on what it stored, else between the
    actor and the learner (preprocessing). NaN transformed: nothing was compared."""
    if transformed != transformed:
        return {}
    if consistency == consistency and consistency <= ACTED_ON_STORED:
        return {"inv_observations_changed_before_acting": transformed, "inv_observations_transformed": 0.0}
    return {"inv_observations_changed_before_acting": float("nan")}


def largest_measured(values) -> float:
    """The largest of the values that are not NaN; NaN when none is."""
    measured = [v for v in values if v == v]
    return max(measured) if measured else float("nan")
