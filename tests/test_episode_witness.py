"""episode_statistics: the episodes the runner reports are the sums and counts of the env's own rewards and steps.

Real runners and envs (CartPole, Pendulum with float rewards of both signs): a correct runner reads exactly 0,
with episodes carried across rollouts; a length, a return or an episode changed after the fact is seen; a
missing record (a rollout dropped on the way) leaves its episodes in progress out, not wrong; and a run with
a planted bookkeeping fault is named on telemetry."""

from __future__ import annotations

import math

import numpy as np
import pytest
from diagnose import diagnose
from planted_bugs import BY_BUG

from rlvitals.actors.agents import RandomAgent
from rlvitals.actors.episode_witness import EpisodeWitness
from rlvitals.actors.rollout import Rollout
from rlvitals.actors.runner import EnvRunner
from rlvitals.telemetry.invariants import BY_NAME

KEY = "inv_episode_statistics"


def rollouts(env_id: str, count: int, steps: int, num_envs: int = 4, **env_kwargs) -> list:
    runner = EnvRunner(env_id, num_envs, seed=5, env_kwargs=env_kwargs or None)
    agent = RandomAgent(runner.action_space, 0)
    try:
        return [runner.collect(agent, steps) for _ in range(count)]
    finally:
        runner.close()


@pytest.mark.parametrize("env_id,steps", [("CartPole-v1", 64), ("Pendulum-v1", 64)])
def test_a_correct_runner_reads_zero_with_episodes_carried_across_rollouts(env_id, steps):
    witness = EpisodeWitness()
    values = [witness.observe(r)[KEY] for r in rollouts(env_id, 10, steps)]
    measured = [v for v in values if not math.isnan(v)]
    # Pendulum's episodes are 200 steps: they end in a rollout other than the one they began in
    assert measured and max(measured) == 0.0, values


def test_changed_lengths_returns_and_lost_episodes_are_seen():
    batch = rollouts("CartPole-v1", 4, 64)
    assert all(len(r.episodes.returns) for r in batch[1:]), "random CartPole ends episodes in every rollout"

    def judged(change) -> float:
        witness = EpisodeWitness()
        for r in batch[:-1]:
            witness.observe(r)
        last = batch[-1]
        episodes = last.episodes
        kept = (episodes.returns.copy(), episodes.lengths.copy())
        change(episodes)
        try:
            return witness.observe(last)[KEY]
        finally:
            episodes.returns, episodes.lengths = kept

    assert judged(lambda e: None) == 0.0
    assert judged(lambda e: setattr(e, "lengths", e.lengths + 1)) == 1.0
    assert judged(lambda e: setattr(e, "returns", e.returns - 1.0)) > 1e-3     # the last reward left out
    assert judged(lambda e: setattr(e, "returns", e.returns[1:])) == 1.0       # an episode lost


def test_a_missing_record_leaves_the_episodes_in_progress_out_not_wrong():
    batch = rollouts("Pendulum-v1", 8, 64)
    witness = EpisodeWitness()
    values = [witness.observe(r)[KEY] for i, r in enumerate(batch) if i != 3]   # rollout 3 never arrives
    assert all(math.isnan(v) or v == 0.0 for v in values), values


def test_a_batch_of_several_runners_is_compared_part_by_part():
    first, second = rollouts("CartPole-v1", 3, 32, num_envs=2), rollouts("CartPole-v1", 3, 32, num_envs=3)
    witness = EpisodeWitness()
    values = []
    for a, b in zip(first, second, strict=True):
        batch = Rollout.concat([a, b])
        values.append(witness.observe(batch)[KEY])
    assert max(v for v in values if not math.isnan(v)) == 0.0, values


@pytest.mark.slow
def test_episode_lengths_that_count_the_reset_step_are_named_on_telemetry(tmp_path):
    bug = BY_BUG["episode_lengths_count_the_reset_step"]
    found = diagnose(tmp_path / "run", env=bug.env, bug=bug, budget_s=600, total_env_steps=40_000)
    loud = [v for v in found.verdicts if v.severity != "info"]
    invariant = BY_NAME["episode_statistics"]
    assert loud and (loud[0].rule, loud[0].component) == (invariant.rule_name, "telemetry"), found.verdicts
    assert loud[0].first_update <= 3
    assert np.isfinite(found.summary["env_steps"])
