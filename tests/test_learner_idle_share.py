"""The whole-run judgement's learner idle share (rlvitals/tracker.py): the share of the learner loop's time spent in
its `wait` phases, waiting for the next batch. Real local runs of a real CartPole; the actor side is slowed by an env
that sleeps in each step, so the same run waits a larger share of its loop, whatever the machine's speed."""

from __future__ import annotations

import json
import time
import uuid

import gymnasium as gym
import pytest

from rlvitals.config import TrainConfig
from rlvitals.session import train_in
from rlvitals.telemetry.interface import RecorderTelemetry
from rlvitals.telemetry.recorder import Recorder


class SleepyCartPole(gym.Wrapper):
    """CartPole whose every step also sleeps `delay` seconds: an actor side slower by a fixed time per step."""

    def __init__(self, delay: float = 0.0):
        super().__init__(gym.make("CartPole-v1"))
        self.delay = delay

    def step(self, action):
        if self.delay:
            time.sleep(self.delay)
        return self.env.step(action)


@pytest.fixture(scope="module")
def env_id():
    name = f"RlvIdleShareCartPole{uuid.uuid4().hex[:8]}-v0"
    gym.register(name, entry_point=SleepyCartPole, disable_env_checker=True)
    yield name
    gym.registry.pop(name)


def idle_share(env_id: str, run_dir, delay: float, telemetry=None) -> tuple[float, float]:
    """(the judgement's learner idle share, the run's wall seconds) from its summary.json."""
    updates = 6
    cfg = TrainConfig(env=env_id, seed=0, run_dir=str(run_dir), total_env_steps=4 * 16 * updates, num_envs=4,
                      rollout_length=16, num_minibatches=2, update_epochs=2, device="cpu", progress=False,
                      verbosity="off" if telemetry is None else "standard", env_kwargs={"delay": delay}).validate()
    summary, path = train_in(cfg, ["test"], telemetry)
    written = json.loads((path / "summary.json").read_text())
    assert written["judgement"]["learner_idle_share"] == summary["judgement"]["learner_idle_share"]
    return summary["judgement"]["learner_idle_share"], summary["wall_seconds"]


def test_the_idle_share_is_a_share_and_grows_when_the_actor_side_is_slowed(env_id, tmp_path):
    normal, _ = idle_share(env_id, tmp_path / "normal", 0.0)
    # 4 envs x 16 steps x 5 ms asleep per rollout, against a learn step on 64 samples: waiting dominates the loop.
    slowed, _ = idle_share(env_id, tmp_path / "slowed", 0.005)
    assert 0.0 <= normal <= 1.0 and 0.0 <= slowed <= 1.0
    assert slowed > normal, (normal, slowed)
    assert (1 - slowed) < (1 - normal) / 2, (normal, slowed)   # the time not spent waiting shrinks as a share


def test_with_telemetry_on_the_idle_share_is_the_exported_wait_phase_over_the_loop(env_id, tmp_path):
    recorder = Recorder("standard", "local")
    share, wall_seconds = idle_share(env_id, tmp_path / "run", 0.002, RecorderTelemetry(recorder))
    wait = recorder.snapshot()[0][("rlvitals_learner_phase_seconds_total", ("wait",))]
    assert 0.0 < share < 1.0
    # The same `wait` blocks as the exported phase (timed just inside its timer), over the learner loop, which is
    # part of the run's wall time: at least the exported wait over the whole run.
    assert share >= 0.99 * wait / wall_seconds, (share, wait, wall_seconds)
