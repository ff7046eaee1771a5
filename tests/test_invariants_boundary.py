"""Data across the boundary (issue 20): the witness's statistics read 0 on healthy runs, local and Ray, and each
planted fault (a monkeypatch or a wrapped env, never product code) drives exactly its own statistic over its limit.

Real gymnasium envs and real training runs throughout; the Ray run starts a private Ray instance of its own (in-process,
loopback only) and stops it at its end.
"""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlvitals.actors.boundary import STATISTICS
from rlvitals.actors.runner import EnvRunner
from rlvitals.config import TrainConfig
from rlvitals.session import train_in
from rlvitals.telemetry.invariant_monitor import InvariantMonitor
from rlvitals.telemetry.invariants import BY_NAME

UPDATES = 4


def config(run_dir: Path, env: str = "CartPole-v1", updates: int = UPDATES, **fields) -> TrainConfig:
    return TrainConfig(**{"env": env, "seed": 0, "run_dir": str(run_dir), "total_env_steps": 8 * 32 * updates,
                          "num_envs": 8, "rollout_length": 32, "num_minibatches": 2, "update_epochs": 1,
                          "device": "cpu", "verbosity": "off", "progress": False, **fields}).validate()


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def statistics(rows: list[dict]) -> dict[str, list[float]]:
    """Each boundary statistic's measured values, update by update (rows leave NaN out)."""
    return {key: [row[key] for row in rows if key in row] for key in STATISTICS}


def broken(rows: list[dict]) -> set[str]:
    """The invariants the monitor counts as broken over these rows, with their limits and holds."""
    monitor = InvariantMonitor([BY_NAME[key.removeprefix("inv_")] for key in STATISTICS])
    for row in rows:
        monitor.observe(row, row["updates"])
    return set(monitor.broken_at)


def assert_healthy(rows: list[dict], unmeasured: tuple[str, ...] = ()) -> None:
    """Every statistic measured (but those `unmeasured` where they do not apply) and 0."""
    seen = statistics(rows)
    for key in STATISTICS:
        assert seen[key] or key in unmeasured, f"{key} was never measured"
        assert max(seen[key], default=0.0) == 0.0, f"{key} on a healthy run: {seen[key]}"


# ---------------------------------------------------------------- healthy
def test_a_healthy_local_run_reads_zero_on_every_boundary_statistic(tmp_path):
    # Episodes cut at 12 steps: ends, truncations and resets in every rollout, so every statistic is measured.
    _, run_dir = train_in(config(tmp_path / "run", env_kwargs={"max_episode_steps": 12}), ["test"])
    rows = rows_of(run_dir)
    assert len(rows) >= UPDATES
    assert_healthy(rows, unmeasured=("inv_env_time_limit",))   # CartPole's vector env keeps its own time limit
    assert not broken(rows)


def test_a_healthy_continuous_run_reads_zero_with_actions_clipped_for_the_env(tmp_path):
    # A Gaussian policy's actions leave Pendulum's [-2, 2]: the env gets them clipped, the rollout keeps them raw.
    _, run_dir = train_in(config(tmp_path / "run", env="Pendulum-v1", env_kwargs={"max_episode_steps": 20}),
                          ["test"])
    assert_healthy(rows_of(run_dir))


# ---------------------------------------------------------------- planted faults
def collect_then(mp, change) -> None:
    """EnvRunner.collect, with `change(rollout)` applied to what it returns (a fault between env and rollout)."""
    original = EnvRunner.collect

    def collect(self, policy, num_steps):
        rollout = original(self, policy, num_steps)
        change(rollout)
        return rollout

    mp.setattr(EnvRunner, "collect", collect)


def shift(x: torch.Tensor) -> torch.Tensor:
    """Each step holds its predecessor's value (the first step repeats)."""
    return torch.cat([x[:1], x[:-1]])


def actions_a_step_late(r):
    r.actions = shift(r.actions)


def rewards_a_step_late(r):
    r.rewards = shift(r.rewards)


def observations_a_step_late(r):
    r.obs = shift(r.obs)


def truncation_stored_as_termination(r):
    r.terminated, r.truncated = r.terminated | r.truncated, torch.zeros_like(r.truncated)


def reset_steps_marked_valid(r):
    r.valid = torch.ones_like(r.valid)


def last_step_dropped(r):
    for name in ("actions", "rewards", "terminated", "truncated", "valid", "behaviour_params", "behaviour_logp"):
        setattr(r, name, getattr(r, name)[:-1])
    r.obs = r.obs[:-1]
    r.valid_count = int(r.valid.sum())


FAULTS = {  # statistic -> (env, fault); Pendulum where rewards and actions vary at every step
    "inv_boundary_actions": ("CartPole-v1", actions_a_step_late),
    "inv_boundary_rewards": ("Pendulum-v1", rewards_a_step_late),
    "inv_boundary_observations": ("CartPole-v1", observations_a_step_late),
    "inv_boundary_episode_ends": ("CartPole-v1", truncation_stored_as_termination),
    "inv_boundary_resets": ("CartPole-v1", reset_steps_marked_valid),
    "inv_boundary_step_count": ("CartPole-v1", last_step_dropped),
}


@pytest.mark.parametrize("key", list(FAULTS))
def test_a_fault_between_env_and_rollout_breaks_exactly_its_statistic(key, tmp_path, monkeypatch):
    env, fault = FAULTS[key]
    collect_then(monkeypatch, fault)
    _, run_dir = train_in(config(tmp_path / "run", env=env, env_kwargs={"max_episode_steps": 12}), ["test"])
    rows = rows_of(run_dir)
    seen = statistics(rows)
    limit = BY_NAME[key.removeprefix("inv_")].limit
    assert seen[key] and min(seen[key]) > limit, f"{key} under the fault: {seen[key]} (limit {limit})"
    assert broken(rows) == {key.removeprefix("inv_")}, {k: v for k, v in seen.items() if v and max(v) > 0}


def test_a_transform_inside_the_runner_is_seen_by_the_witness_below_it(tmp_path, monkeypatch):
    original = EnvRunner._as_obs

    def scaled(self, obs):                      # the runner's own intake halves what the env emitted
        return original(self, obs) * np.float32(0.5)

    monkeypatch.setattr(EnvRunner, "_as_obs", scaled)
    _, run_dir = train_in(config(tmp_path / "run", env_kwargs={"max_episode_steps": 12}), ["test"])
    rows = rows_of(run_dir)
    # Changed, and found at no neighbouring step either: a transform, not a pairing fault; made before the actor
    # acted on it (the learner reproduces the actor's log-probabilities there), so the actor's, not preprocessing.
    assert min(statistics(rows)["inv_observations_changed_before_acting"]) == pytest.approx(0.5)   # |x/2 - x| / |x|
    assert max(statistics(rows)["inv_observations_transformed"]) == 0
    assert max(statistics(rows)["inv_boundary_observations"]) == 0
    assert broken(rows) == {"observations_changed_before_acting"}


class OffsetCartPole(gym.ObservationWrapper):
    """CartPole whose cart position is reported 10 units further right than its space's bound of 4.8 allows."""

    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))

    def observation(self, obs):
        return (obs + np.array([10.0, 0, 0, 0], dtype=obs.dtype)).astype(obs.dtype)


def test_an_env_that_leaves_its_declared_space_breaks_the_observation_space_invariant(tmp_path):
    env_id = f"RlvBoundaryOffsetCartPole{uuid.uuid4().hex[:8]}-v0"
    gym.register(env_id, entry_point=OffsetCartPole, disable_env_checker=True)
    try:
        _, run_dir = train_in(config(tmp_path / "run", env=env_id, updates=6), ["test"])
    finally:
        gym.registry.pop(env_id)
    rows = rows_of(run_dir)
    seen = statistics(rows)["inv_observation_space"]
    assert len(seen) >= 6 and set(seen) == {1.0}, seen
    assert broken(rows) == {"observation_space"}


def test_nan_when_nothing_was_there_to_compare():
    """Without an episode end or a reset step in the rollout, those two statistics measured nothing."""
    from rlvitals.actors.agents import RandomAgent
    from rlvitals.actors.boundary import boundary_statistics

    runner = EnvRunner("Pendulum-v1", 2, 0)   # 200-step episodes: none ends in 8 steps
    try:
        stats = boundary_statistics(runner.collect(RandomAgent(runner.action_space, 0), 8))
    finally:
        runner.close()
    assert math.isnan(stats["inv_boundary_episode_ends"]) and math.isnan(stats["inv_boundary_resets"])
    assert stats["inv_boundary_actions"] == stats["inv_boundary_rewards"] == 0.0


# ---------------------------------------------------------------- the doctor on a run that made no update
def test_the_ray_leg_reports_a_run_without_update_instead_of_failing_to_load_its_checkpoint(tmp_path, monkeypatch):
    from rlvitals.doctor import rayleg
    from rlvitals.training import LocalRollouts

    def next_dropped(self):                     # every batch arrives stale: the learner never updates
        rollout = self.runner.collect(self.agent, self.run.cfg.rollout_length)
        self.run.drop("stale", rollout.env_steps)

    monkeypatch.setattr(LocalRollouts, "next", next_dropped)
    cfg = config(tmp_path / "run")
    run = {**rayleg._train(cfg, tmp_path / "run", "local"), "cfg": cfg}
    assert run["net"] is None and run["summary"]["updates"] == 0
    message = rayleg.no_update_message("async", run)
    assert message.startswith("the async run made no update") and f"{cfg.total_env_steps} env steps" in message


# ---------------------------------------------------------------- Ray: the witness and the actors' accounting
@pytest.mark.slow
def test_a_healthy_ray_run_reads_zero_and_accounts_for_every_rollout(tmp_path):
    """Two asynchronous actors: the witness's records and the actors' counters travel through Ray with each
    rollout; every statistic reads 0 and every rollout an actor produced is received or left in flight."""
    cfg = config(tmp_path / "run", updates=4, mode="ray", num_actors=2, actor_cpus=0.5, torch_threads=1,
                 env_kwargs={"max_episode_steps": 12})
    summary, run_dir = train_in(cfg, ["test"])
    rows = rows_of(run_dir)
    assert_healthy(rows, unmeasured=("inv_env_time_limit",))   # CartPole's vector env keeps its own time limit
    steps = [row["inv_env_steps_accounted"] for row in rows if "inv_env_steps_accounted" in row]
    assert len(steps) == len(rows) and set(steps) == {0.0}     # every env step the witnesses counted arrived
    accounting = [row["inv_actor_accounting"] for row in rows if "inv_actor_accounting" in row]
    assert len(accounting) == len(rows) and set(accounting) == {0.0}
    actors = summary["samples"]["actors"]
    assert actors["mismatch"] == 0 and set(actors["per_actor"]) == {"0", "1"}, actors
    for counts in actors["per_actor"].values():
        assert counts["produced"] == counts["received"] + counts["in_flight"] > 0, counts
        assert all(seconds >= 0 for seconds in counts["seconds"].values()) and counts["seconds"]["env_step"] > 0


def test_a_rollout_received_twice_breaks_the_actor_accounting():
    """The driver's check, on rollouts a real runner collected and a real actor's counters stamped."""
    from rlvitals.actors.agents import RandomAgent
    from rlvitals.distributed.accounting import ActorAccounts, ActorCounters

    runner = EnvRunner("CartPole-v1", 2, 0)
    counters, accounts = ActorCounters(0, 1234), ActorAccounts()
    try:
        for _ in range(2):
            counters.task_started()
            rollout = runner.collect(RandomAgent(runner.action_space, 0), 4)
            counters.produced_one()
            counters.phases(rollout, 0.0)
            counters.deliver(rollout)
            accounts.arrived(rollout)
            assert accounts.take_statistic()["inv_actor_accounting"] == 0.0
        accounts.arrived(rollout)              # the same result handed to the driver again
    finally:
        runner.close()
    assert accounts.take_statistic()["inv_actor_accounting"] == 1.0
    assert "inv_actor_accounting" not in accounts.take_statistic(), "measured once per arrival, then not until the next"
    assert accounts.summary()["mismatch"] == 1


def test_rollouts_side_by_side_keep_each_witness_record_at_its_envs():
    """Sync Ray mode learns from actors' rollouts concatenated: each record must still meet its own envs."""
    from rlvitals.actors.agents import RandomAgent
    from rlvitals.actors.boundary import boundary_statistics
    from rlvitals.actors.rollout import Rollout

    runners = [EnvRunner("CartPole-v1", n, seed, actor_id=i) for i, (n, seed) in enumerate([(2, 1), (3, 2)])]
    try:
        parts = [r.collect(RandomAgent(r.action_space, 0), 40) for r in runners]
    finally:
        for r in runners:
            r.close()
    batch = Rollout.concat(parts)
    assert [w.env_offset for w in batch.witness] == [0, 2]
    assert {k: v for k, v in boundary_statistics(batch).items() if v != 0 and not math.isnan(v)} == {}
    reversed_batch = Rollout.concat(parts[::-1])       # the other order: the records follow their envs
    assert [w.env_offset for w in reversed_batch.witness] == [0, 3]
    assert {k: v for k, v in boundary_statistics(reversed_batch).items() if v != 0 and not math.isnan(v)} == {}
    # Each record placed at the other part's envs: what those envs did is not what it saw.
    batch.witness = (dataclasses.replace(batch.witness[0], env_offset=3),
                     dataclasses.replace(batch.witness[1], env_offset=0))
    assert boundary_statistics(batch)["inv_boundary_actions"] > 0
