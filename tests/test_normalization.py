"""Observation normalisation and reward scaling (issue 15), on real envs.

The running statistics against numpy on the concatenated data; the actors and the learner normalising
alike (same normalised input, same log-probability, zero logp discrepancy at staleness 0, a Ray-style copy
loaded from the published weights); the reward divisor against a naive reference; statistics through a
checkpoint, a resume and eval; short runs that still learn. Local against `--mode ray --sync` with both on
is tests/test_ray.py::test_one_actor_sync_replays_local_mode[normalized] (on that module's Ray head).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from rlvitals.actors.runner import EnvRunner
from rlvitals.archive import RunArchive
from rlvitals.config import TrainConfig
from rlvitals.learner.normalize import EPSILON, ObservationNormalizer
from rlvitals.parts import make_learner, make_network, return_discount, seed_everything

CPU = torch.device("cpu")
SMALL = ["--num-envs", "4", "--rollout-length", "64", "--num-minibatches", "2", "--update-epochs", "2"]
BOTH_ON = ["--normalize-observations", "true", "--normalize-rewards", "true"]


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    return subprocess.run([sys.executable, "-m", "rlvitals.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def train(run_dir, *args: str, timeout: float = 300) -> dict:
    """`rlvitals train` into run_dir (None: where the args say, as for --resume); its summary."""
    where = ["--run-dir", str(run_dir)] if run_dir else []
    done = cli("train", *where, "--progress", "false", *args, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def parts(**overrides):
    """A CartPole runner, network and learner as a run builds them, with `overrides` in the config."""
    cfg = TrainConfig(env="CartPole-v1", num_envs=4, rollout_length=64, num_minibatches=2, update_epochs=2,
                      progress=False, **overrides).validate()
    seed_everything(cfg.seed, 1)
    runner = EnvRunner(cfg.env, cfg.num_envs, 0, return_discount=return_discount(cfg))
    net = make_network(cfg, runner.obs_space, runner.action_space)
    return cfg, runner, net, make_learner(cfg, net, CPU)


def valid_obs(rollout) -> np.ndarray:
    """The observations acted on at valid steps: what the learner merges into the statistics."""
    obs = rollout.obs[:-1].numpy()
    return obs[rollout.valid.numpy()].astype(np.float64)


# ----------------------------------------------------------------- statistics
def test_merged_moments_are_numpys_mean_and_variance_of_everything_seen():
    norm = ObservationNormalizer((1,))
    norm.update(torch.tensor([[1.0], [3.0]]))
    norm.update(torch.tensor([[5.0], [math.inf], [1e35], [math.nan]]))   # only 5 counts
    assert float(norm.count) == 3 and float(norm.mean) == 3.0
    assert float(norm.var) == pytest.approx(8 / 3, rel=1e-15)          # ((1-3)^2 + 0 + (5-3)^2) / 3
    norm.update(torch.zeros((0, 1)))                                    # an empty batch changes nothing
    assert float(norm.count) == 3 and float(norm.var) == pytest.approx(8 / 3, rel=1e-15)

    runner = EnvRunner("CartPole-v1", 4, 0)
    norm, seen = ObservationNormalizer(runner.obs_space.shape), []
    try:
        from rlvitals.actors.agents import RandomAgent

        agent = RandomAgent(runner.action_space, 0)
        for length in (50, 7, 100):
            rollout = runner.collect(agent, length)
            norm.update(rollout.obs[:-1][rollout.valid])
            seen.append(valid_obs(rollout))
    finally:
        runner.close()
    data = np.concatenate(seen)
    assert float(norm.count) == len(data)
    np.testing.assert_allclose(norm.mean.numpy(), data.mean(0), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(norm.var.numpy(), data.var(0), rtol=1e-12)


# ------------------------------------------------------ actors against learner
def test_actors_and_learner_normalise_alike_and_the_learner_updates_after_learning():
    cfg, runner, net, learner = parts(normalize_observations=True)
    actor_net = make_network(cfg, runner.obs_space, runner.action_space)   # a Ray actor's copy
    try:
        seen = 0
        for _ in range(3):
            rollout = runner.collect(net, cfg.rollout_length)   # local mode: the actors act with the learner's net
            stats = learner.learn(rollout)
            # The batch is learned with the statistics it was collected with: the health rule's discrepancy is 0.
            assert stats["logp_discrepancy"] == 0.0
            seen += rollout.valid_count
            assert float(net.obs_normalizer.count) == seen == stats["obs_norm_samples"]   # merged after learning
        actor_net.load_state_dict({k: v.clone() for k, v in net.state_dict().items()})  # as Fleet.publish sends it
        obs = runner.collect(net, 8).obs.reshape(-1, *runner.obs_space.shape)
    finally:
        runner.close()
    assert float(actor_net.obs_normalizer.count) == seen and actor_net.age == net.age

    mean, var = net.obs_normalizer.mean.numpy(), net.obs_normalizer.var.numpy()
    by_hand = np.clip((obs.numpy() - mean) / np.sqrt(var + EPSILON), -10, 10)
    np.testing.assert_allclose(net.normalized(obs).numpy(), by_hand, rtol=1e-5, atol=1e-6)
    assert torch.equal(actor_net.normalized(obs), net.normalized(obs))
    actions, params, logp = actor_net.act(obs)                   # the actor's path
    learner_params, _ = net(obs)                                 # the learner's path
    assert torch.equal(params, learner_params)
    assert torch.equal(logp, net.dist.log_prob(learner_params, actions))
    assert not torch.equal(net.normalized(obs), obs)             # and it does normalise


def test_off_by_default_the_network_and_rows_are_as_before():
    cfg, runner, net, learner = parts()
    try:
        stats = learner.learn(runner.collect(net, cfg.rollout_length))
    finally:
        runner.close()
    assert net.obs_normalizer is None and not any("normalizer" in k for k in net.state_dict())
    assert (stats["obs_norm_samples"], stats["obs_norm_abs_mean"], stats["obs_norm_std"]) == (0.0, 0.0, 1.0)
    assert stats["reward_divisor"] == 1.0 and stats["reward_max"] == 1.0   # CartPole's raw reward


def test_a_batch_whose_update_is_undone_leaves_both_statistics_as_they_were():
    cfg, runner, net, learner = parts(normalize_observations=True, normalize_rewards=True)
    try:
        learner.learn(runner.collect(net, cfg.rollout_length))
        before = ({k: v.clone() for k, v in net.state_dict().items()}, learner.extra_state()["normalization"])
        learner.set_learning_rate(math.inf)   # the update's weights go non-finite: the batch is skipped
        stats = learner.learn(runner.collect(net, cfg.rollout_length))
    finally:
        runner.close()
    assert stats["nonfinite"] == 1.0
    assert all(torch.equal(v, before[0][k]) for k, v in net.state_dict().items())
    assert all(torch.equal(v, before[1]["returns"][k])
               for k, v in learner.extra_state()["normalization"]["returns"].items())


# -------------------------------------------------------------- reward scaling
def test_reward_divisor_is_the_running_std_of_each_envs_discounted_return():
    cfg, runner, net, learner = parts(normalize_rewards=True, gamma=0.9)
    running, every = np.zeros(cfg.num_envs), []
    try:
        for _ in range(4):
            rollout = runner.collect(net, cfg.rollout_length)
            rewards, valid = rollout.rewards.numpy(), rollout.valid.numpy()
            done = (rollout.terminated | rollout.truncated).numpy()
            expected = np.zeros_like(rewards, dtype=np.float64)
            for t in range(rewards.shape[0]):          # slowly, one env and one step at a time
                for i in range(rewards.shape[1]):
                    if valid[t, i]:
                        running[i] = running[i] * 0.9 + rewards[t, i]
                        every.append(running[i])
                    expected[t, i] = running[i]
                    if valid[t, i] and done[t, i]:
                        running[i] = 0.0
            np.testing.assert_allclose(rollout.discounted_returns.numpy(), expected, rtol=1e-6)
            stats = learner.learn(rollout)
            divisor = math.sqrt(np.var(np.asarray(every, dtype=np.float32).astype(np.float64)) + EPSILON)
            assert stats["reward_divisor"] == pytest.approx(divisor, rel=1e-6)
            # The learner learns from CartPole's +1 rewards divided by it; episode returns stay raw.
            assert stats["reward_mean"] == pytest.approx(min(1 / divisor, 10.0), rel=1e-6)
            assert all(r == int(r) and r >= 8 for r in rollout.episodes.returns)
    finally:
        runner.close()
    assert len(every) > 900 and 1.0 < divisor < 5.0


# ---------------------------------------------------- checkpoints, resume, eval
def test_statistics_survive_a_resume_and_are_what_eval_uses(tmp_path):
    from rlvitals.evaluate import load_network

    run = tmp_path / "run"
    train(run, "--total-env-steps", "1024", "--verbosity", "off", *SMALL, *BOTH_ON)
    first = RunArchive(run).load_checkpoint()
    count = float(first["network"]["obs_normalizer.count"])
    assert count == first["tracker"]["env_steps"] > 0
    assert float(first["learner_state"]["normalization"]["returns"]["count"]) == count

    _, net = load_network(str(run))                 # eval's network carries the run's statistics
    assert torch.equal(net.obs_normalizer.mean, first["network"]["obs_normalizer.mean"].to(net.obs_normalizer.mean))
    assert float(net.obs_normalizer.count) == count

    summary = train(None, "--resume", str(run), "--total-env-steps", "2048")
    assert summary["env_steps"] >= 2048
    written = rows(run)
    # Every row, before the resume and after: the normaliser has merged exactly the samples learned from.
    assert [row["obs_norm_samples"] for row in written] == [float(row["samples"]) for row in written]
    last = RunArchive(run).load_checkpoint()
    assert float(last["learner_state"]["normalization"]["returns"]["count"]) == last["tracker"]["env_steps"]


# ------------------------------------------------------------- short real runs
@pytest.mark.slow
def test_cartpole_still_learns_with_both_on_and_pendulum_runs(tmp_path):
    summary = train(tmp_path / "cartpole", "--total-env-steps", "40000", "--num-envs", "8", "--verbosity", "off",
                    *BOTH_ON)
    assert summary["mean_return_last_100"] >= 100, summary
    last = rows(tmp_path / "cartpole")[-1]
    assert last["reward_divisor"] > 1 and last["obs_norm_samples"] == last["samples"]

    summary = train(tmp_path / "pendulum", "--env", "Pendulum-v1", "--total-env-steps", "4096", *SMALL,
                    "--verbosity", "off", *BOTH_ON)
    assert summary["status"] == "completed" and summary["nonfinite_batches_skipped"] == 0
    last = rows(tmp_path / "pendulum")[-1]
    assert last["obs_norm_samples"] == last["samples"] and last["obs_norm_std"] > 0.1
    assert last["return_mean"] < -100   # episode returns in Pendulum's own units, not the scaled ones


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("args, named", [
    (["--normalize-clip", "0"], "normalize_clip=0"),
    (["--env", "FrozenLake-v1", "--normalize-observations", "true"], "normalize_observations=True"),
])
def test_bad_settings_are_one_line_and_leave_nothing(tmp_path, args, named):
    done = cli("train", "--run-dir", str(tmp_path / "run"), "--progress", "false", *args)
    assert done.returncode == 2 and named in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
