"""The env's stages re-derived from their own inputs (issue 31): the witness sits directly on what gymnasium
built, the env's time limit is judged by probes on both sides of its TimeLimit, and every env step the witness
counts reaches the learner or is dropped with a reason.

Planted faults come from tests/planted_env_stages.py (monkeypatches, never product code); each must be named
on its component by the first warning-or-worse verdict. Healthy envs, tiny user envs solved exactly and run
far past convergence included, must read 0 and raise nothing.
"""

from __future__ import annotations

import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import planted_bugs
import pytest
import tiny_envs  # registers Corridor-v0, Bandit-v0 and the envs whose reset must restore state
from diagnose import LOUD, diagnose
from planted_bugs import BY_BUG

from rlvitals.actors.agents import RandomAgent
from rlvitals.actors.boundary import boundary_statistics, split_observation_change
from rlvitals.actors.envs import find_witness, make_vector_env
from rlvitals.actors.runner import EnvRunner
from rlvitals.actors.witness import Witness
from rlvitals.telemetry.invariants import BY_NAME, STAGES

HUNG_S = 120
"""Run seconds after which a planted run without a verdict counts as hung (they take 1-15 s here)."""


def time_limit_statistics(env_id: str, steps: int, rollouts: int = 3, **env_kwargs) -> list[float]:
    runner = EnvRunner(env_id, 4, 0, env_kwargs=env_kwargs or None)
    try:
        agent = RandomAgent(runner.action_space, 0)
        return [boundary_statistics(runner.collect(agent, steps))["inv_env_time_limit"] for _ in range(rollouts)]
    finally:
        runner.close()


# ---------------------------------------------------------------- where the witness sits
def test_the_witness_sits_directly_on_what_gymnasium_built_under_anything_wrapped_around_it():
    from gymnasium.wrappers.vector import TransformReward

    env = TransformReward(make_vector_env("Pendulum-v1", 2, witness_seed=0), lambda r: r * 0.5)
    try:
        witness = find_witness(env)
        assert isinstance(witness, Witness) and isinstance(witness.env, gym.vector.SyncVectorEnv)
    finally:
        env.close()


# ---------------------------------------------------------------- the time limit's contract
@pytest.mark.parametrize("env_id,steps,kwargs", [
    ("Pendulum-v1", 32, {"max_episode_steps": 20}),   # truncated by the limit only
    ("Acrobot-v1", 64, {"max_episode_steps": 30}),    # terminations and truncations
    ("tiny_envs:Corridor-v0", 16, {}),                # truncates for its own reason below its limit
    ("tiny_envs:Bandit-v0", 8, {}),                   # a limit of 1: terminated and truncated at once
])
def test_a_correct_time_limit_reads_zero(env_id, steps, kwargs):
    seen = [v for v in time_limit_statistics(env_id, steps, **kwargs) if not math.isnan(v)]
    assert seen and set(seen) == {0.0}, seen


def test_envs_without_gymnasiums_time_limit_are_not_judged():
    assert all(math.isnan(v) for v in time_limit_statistics("CartPole-v1", 16))      # its vector env's own limit
    assert all(math.isnan(v) for v in time_limit_statistics("Pendulum-v1", 16, max_episode_steps=-1))


def test_a_limit_not_enforced_and_a_count_not_reset_are_both_counted(monkeypatch):
    from planted_env_stages import time_limit_counter_not_reset

    time_limit_counter_not_reset(monkeypatch)   # every episode after the first truncated after one step
    assert all(v > 0 for v in time_limit_statistics("Pendulum-v1", 32, max_episode_steps=10)[1:])
    monkeypatch.undo()
    # The reverse: a TimeLimit that never truncates lets the count pass the limit untruncated.
    monkeypatch.setattr(gym.wrappers.TimeLimit, "step", lambda self, action: self.env.step(action))
    seen = time_limit_statistics("Pendulum-v1", 32, max_episode_steps=10)
    assert all(v > 0 for v in seen), seen
    assert BY_NAME["env_time_limit"].component == "env"


# ---------------------------------------------------------------- the env's reset restores its whole state
def random_rollouts(env_id: str, steps: int, rollouts: int, num_envs: int = 4, **env_kwargs) -> list:
    runner = EnvRunner(env_id, num_envs, 0, env_kwargs=env_kwargs or None)
    try:
        agent = RandomAgent(runner.action_space, 0)
        return [runner.collect(agent, steps) for _ in range(rollouts)]
    finally:
        runner.close()


def reset_replays(env_id: str, steps: int, rollouts: int = 4, **env_kwargs) -> list[tuple]:
    """(episodes replayed, of them those that differ, the statistic) per rollout of a random agent."""
    collected = random_rollouts(env_id, steps, rollouts, **env_kwargs)
    return [(r.witness[0].reset_replays, r.witness[0].reset_replays_differ,
             boundary_statistics(r)["inv_env_reset_restores"]) for r in collected]


@pytest.mark.parametrize("env_id,steps,kwargs", [
    ("Pendulum-v1", 48, {"max_episode_steps": 20}),
    ("Acrobot-v1", 48, {"max_episode_steps": 30}),
    ("MountainCar-v0", 48, {"max_episode_steps": 20}),
    ("MountainCarContinuous-v0", 48, {"max_episode_steps": 20}),
    ("tiny_envs:Corridor-v0", 16, {}),
    ("tiny_envs:Bandit-v0", 8, {}),
    ("tiny_envs:SelfLimitedCartPole-v0", 64, {}),   # its own time limit: 200 steps, reset with the episode
    ("tiny_envs:Orchard-v0", 32, {}),
])
def test_healthy_envs_replay_their_episodes_exactly(env_id, steps, kwargs):
    seen = reset_replays(env_id, steps, **kwargs)
    assert sum(replayed for replayed, _, _ in seen) > 0, seen
    assert all(differ == 0 for _, differ, _ in seen), seen


def test_lunar_lander_replays_its_episodes_exactly():
    pytest.importorskip("Box2D")
    seen = reset_replays("LunarLander-v3", 64, rollouts=6, max_episode_steps=40)
    assert sum(replayed for replayed, _, _ in seen) > 0 and all(differ == 0 for _, differ, _ in seen), seen


def test_envs_without_sub_envs_and_envs_stochastic_whatever_the_seed_are_not_judged():
    # CartPole's own vector env has no sub-env to rebuild; the noisy bandit's rewards follow from no input.
    for env_id in ("CartPole-v1", "tiny_envs:NoisyBandit-v0"):
        seen = reset_replays(env_id, 16)
        assert all(replayed == 0 and math.isnan(statistic) for replayed, _, statistic in seen), (env_id, seen)


@pytest.mark.parametrize("plant,env_id,steps", [
    ("own_time_limit_counter_not_reset", "tiny_envs:SelfLimitedCartPole-v0", 64),   # past 200 steps: 1-step episodes
    ("orchard_fruit_not_restored", "tiny_envs:Orchard-v0", 32),                      # rewards gone, obs unchanged
])
def test_state_carried_across_reset_is_counted_on_the_env(plant, env_id, steps, monkeypatch):
    import planted_env_stages

    getattr(planted_env_stages, plant)(monkeypatch)
    seen = reset_replays(env_id, steps, rollouts=6)
    assert any(differ > 0 for _, differ, _ in seen), seen
    assert all(differ == replayed for replayed, differ, _ in seen[4:]), seen   # every later replay, once it shows
    assert BY_NAME["env_reset_restores"].component == "env"


def test_the_replay_changes_nothing_the_run_collects_nor_the_global_generators(monkeypatch):
    import numpy as np
    import torch

    from rlvitals.actors import witness

    def collect() -> tuple[list, tuple]:
        np.random.seed(7)
        torch.manual_seed(7)
        rollouts = random_rollouts("tiny_envs:SelfLimitedCartPole-v0", 64, 5)
        drawn = (np.random.random(), float(torch.rand(1)))
        return [(r.obs.numpy(), r.rewards.numpy(), r.terminated.numpy(), r.truncated.numpy()) for r in rollouts], drawn

    replayed, drawn = collect()
    monkeypatch.setattr(witness.ResetReplay, "attach", classmethod(lambda cls, env: None))
    plain, plain_drawn = collect()
    assert drawn == plain_drawn
    for a, b in zip(replayed, plain, strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_an_observation_change_is_the_actors_when_it_acted_on_the_changed_observation():
    # At staleness 0 the learner reproduces the actor's log-probabilities at the stored observations exactly when
    # the actor acted on them: the change was made before acting.
    assert split_observation_change(0.25, 0.0) == {"inv_observations_changed_before_acting": 0.25,
                                                   "inv_observations_transformed": 0.0}
    after_acting = split_observation_change(0.25, 0.3)   # the learner sees something the actor did not act on
    assert math.isnan(after_acting["inv_observations_changed_before_acting"]) and len(after_acting) == 1
    assert math.isnan(split_observation_change(0.25, math.nan)["inv_observations_changed_before_acting"])   # stale
    assert split_observation_change(math.nan, 0.0) == {}   # nothing compared


def test_the_acting_check_recomputes_the_recorded_parameters_from_the_stored_observations():
    from rlvitals.actors.acting_check import FIRST, ActingCheck
    from rlvitals.actors.runner import SAFE_OBS_LIMIT
    from rlvitals.learner.networks import ActorCritic

    runner = EnvRunner("Pendulum-v1", 4, seed=0)
    net = ActorCritic(runner.obs_space, runner.action_space, (16, 16))
    rollout = runner.collect(net, 16)
    obs, params = rollout.obs.numpy(), rollout.behaviour_params.numpy()
    check = ActingCheck(0, SAFE_OBS_LIMIT)
    assert check.measure(net, obs, params, recurrent=False) < 1e-6        # same weights, same observations
    assert check.measure(net, obs, params + 0.01, recurrent=False) > 1e-3  # not what the network gives there
    assert math.isnan(check.measure(net, obs, params, recurrent=True))      # the learner replays a state
    assert math.isnan(check.measure(RandomAgent(runner.action_space, 0), obs, params, recurrent=False))
    for _ in range(FIRST - 3):
        check.measure(net, obs, params, recurrent=False)
    assert math.isnan(check.measure(net, obs, params, recurrent=False))    # past the first 16: every 16th
    runner.close()


def test_an_observation_changed_after_the_actor_acted_is_still_named_preprocessing(tmp_path):
    found = diagnose(tmp_path / "run", bug=BY_BUG["preprocessing_learner_only"], budget_s=HUNG_S)
    assert found.first is not None and (found.first.rule, found.first.component) == (
        BY_NAME["observations_transformed"].rule_name, "preprocessing"), found.verdicts


# ---------------------------------------------------------------- planted faults, named
@pytest.mark.slow
@pytest.mark.parametrize("name", ["reward_transform_wrapped_over_the_env", "time_limit_counter_not_reset",
                                  "own_time_limit_counter_not_reset", "orchard_fruit_not_restored",
                                  "runner_discards_every_other_rollout",
                                  "ray_one_actor_of_four_discards_every_other_rollout",
                                  "runner_reads_observations_at_half_precision",
                                  "runner_acts_with_its_fallback_everywhere_pendulum"])
def test_planted_env_stage_fault_is_named_on_its_component_first(name, tmp_path):
    bug = BY_BUG[name]
    found = diagnose(tmp_path / name, bug=bug, budget_s=HUNG_S)
    first = found.first
    assert first is not None, f"{name}: no verdict in {HUNG_S} s"
    # Its invariant, or another of the same stage that saw it first (a TimeLimit's count not reset is also state
    # carried across the env's reset, which the replay of an episode may see an update sooner).
    stage = next(names for _, _, names in STAGES if bug.invariant in names)
    assert first.component == bug.component, found.verdicts
    assert first.rule in {BY_NAME[name].rule_name for name in stage}, found.verdicts
    if bug.one_actor:   # that actor's process named, and no other
        pid = Path(planted_bugs.claim_path).read_text()
        assert f"(pid {pid}): " in first.message and first.message.count("(pid ") == 1, first.message


# ---------------------------------------------------------------- healthy: solved exactly, run far past it
@pytest.mark.slow
def test_a_tiny_corridor_solved_exactly_and_run_far_past_it_raises_nothing(tmp_path):
    found = diagnose(tmp_path / "run", env="tiny_envs:Corridor-v0", budget_s=HUNG_S, stop_on_verdict=False,
                     total_env_steps=8_000, num_envs=8, rollout_length=16, learning_rate=5e-3)
    assert not [v for v in found.verdicts if v.severity in LOUD], found.verdicts
    assert found.summary["mean_return_last_100"] == 1.0, found.summary   # solved exactly
    limits = [row["inv_env_time_limit"] for row in found.rows if "inv_env_time_limit" in row]
    assert limits and set(limits) == {0.0}


def test_offset_discrete_spaces_train_quietly_and_the_saved_policy_acts_in_the_envs_own_actions(tmp_path):
    # Discrete(n, start=s): the network one-hots observations from s, the env receives index + s, the witness
    # compares the stored index plus s, and a loaded policy predicts the env's own actions.
    from rlvitals.api import load_policy

    found = diagnose(tmp_path / "run", env="tiny_envs:OffsetCorridor-v0", budget_s=HUNG_S, stop_on_verdict=False,
                     total_env_steps=4_000, num_envs=8, rollout_length=16, learning_rate=5e-3)
    assert not [v for v in found.verdicts if v.severity in LOUD], found.verdicts
    assert found.summary["mean_return_last_100"] == 1.0, found.summary
    actions = [row["inv_boundary_actions"] for row in found.rows if "inv_boundary_actions" in row]
    assert actions and set(actions) == {0.0}
    policy = load_policy(found.run_dir, env="tiny_envs:OffsetCorridor-v0")
    start = tiny_envs.OffsetCorridor.START
    assert policy.predict(np.arange(start, start + 3)).tolist() == [2, 2, 2]   # right, in the env's numbering


# ---------------------------------------------------------------- every env step counted at the lowest level
def test_steps_dropped_with_a_reason_are_accounted_for_and_steps_lost_without_one_are_not():
    from rlvitals.distributed.accounting import ActorCounters
    from rlvitals.evidence import WitnessedSteps

    runner = EnvRunner("CartPole-v1", 2, 0)
    try:
        agent = RandomAgent(runner.action_space, 0)
        first, dropped, third, lost, fifth = (runner.collect(agent, 8) for _ in range(5))
    finally:
        runner.close()
    counters, ledger = ActorCounters(0, 1), WitnessedSteps()

    def arrives(rollout) -> dict:
        rollout.actor_counters = (counters.snapshot(),)   # stamped as it is delivered
        ledger.arrived(rollout, "actor 0 (pid 1)")
        return ledger.take_statistic()

    assert arrives(first) == {"inv_env_steps_accounted": 0.0}
    counters.dropped_one("ValueError", dropped)        # the actor says why, and how many env steps
    assert arrives(third) == {"inv_env_steps_accounted": 0.0}
    seen = arrives(fifth)
    assert seen["inv_env_steps_accounted"] == 16.0       # `lost`: 8 vector steps of 2 envs, said nowhere
    assert seen["env_steps_accounted_named"].startswith("actor 0 (pid 1): 1 of 3 rollouts")
    assert BY_NAME["env_steps_accounted"].component == "actor"

