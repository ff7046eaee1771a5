"""The witness's record (actors/witness.py) on a real CartPole vector env: what the env returned, whatever the
number of steps, the outputs' dtypes along the rollout, or the way it travels (pickled, as Ray ships it)."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np

from rlvitals.actors.envs import make_vector_env
from rlvitals.actors.witness import Witness

N = 4


class Recorded(gym.vector.VectorWrapper):
    """Keeps its own copy of what it returns; with `switch`, rewards come as integers, then from step `switch` on
    as float64 with a fraction (a buffer kept in the first rows' dtype would cut it off)."""

    def __init__(self, env, switch: int | None = None):
        super().__init__(env)
        self.switch, self.steps, self.rewards, self.terminated, self.truncated = switch, 0, [], [], []

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.env.step(actions)
        if self.switch is not None:
            reward = reward.astype(np.float64) + 0.25 if self.steps >= self.switch else reward.astype(np.int64)
        self.steps += 1
        for kept, value in ((self.rewards, reward), (self.terminated, terminated), (self.truncated, truncated)):
            kept.append(np.array(value, copy=True))
        return obs, reward, terminated, truncated, info


def witnessed(inner: Recorded, announced: int, taken: int):
    witness = Witness(inner, seed=0)
    witness.reset(seed=0)
    witness.begin(announced)
    rng = np.random.default_rng(0)
    for _ in range(taken):
        witness.step(rng.integers(0, 2, N))
    return witness.take()


def test_more_steps_than_announced_and_a_dtype_change_are_recorded_exactly():
    inner = Recorded(make_vector_env("CartPole-v1", N, env_kwargs={"max_episode_steps": 7}), switch=5)
    record = witnessed(inner, announced=4, taken=23)
    assert record.complete and record.steps == 23 * N
    np.testing.assert_array_equal(record.rewards, np.stack(inner.rewards).astype(np.float32))
    assert {1.0, 1.25} <= set(np.unique(record.rewards).tolist())   # integers first, fractions after
    np.testing.assert_array_equal(record.terminated, np.stack(inner.terminated))
    np.testing.assert_array_equal(record.truncated, np.stack(inner.truncated))
    assert record.truncated.any()   # episodes of 7 steps: the resets are counted from the flags
    assert record.agent_steps == record.steps - int(np.count_nonzero(record.resets))


def test_pickled_records_keep_every_value_in_fewer_bytes():
    record = witnessed(Recorded(make_vector_env("CartPole-v1", N)), announced=16, taken=16)
    shipped = pickle.loads(pickle.dumps(record))
    assert shipped.actions.dtype == np.uint8 and record.actions.dtype == np.int64
    np.testing.assert_array_equal(shipped.actions, record.actions)


def test_ragged_output_leaves_the_record_incomplete_instead_of_failing_the_step():
    class Ragged(Recorded):
        def step(self, actions):
            obs, reward, terminated, truncated, info = super().step(actions)
            return obs, (reward[:-1] if self.steps == 3 else reward), terminated, truncated, info

    record = witnessed(Ragged(make_vector_env("CartPole-v1", N)), announced=8, taken=8)
    assert not record.complete
