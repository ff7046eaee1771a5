"""The learner's diagnostics report the right values: the real learner on probe envs and CartPole.

Each statistic is checked where its true value is known: a uniform policy's
relative entropy is 1, the KL between a policy and itself is 0, a value net
that outputs 0 explains none of the targets' variance, a synchronous local
run is never stale, a step's size is the parameter difference. The runs
record through a real Recorder (telemetry's side is tested in test_telemetry_recorder.py).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from rlvitals.actors.runner import EnvRunner
from rlvitals.config import TrainConfig
from rlvitals.doctor import probe_config
from rlvitals.learner.networks import Categorical, DiagGaussian
from rlvitals.learner.ppo import PPOLearner
from rlvitals.session import train_in
from rlvitals.telemetry.interface import RecorderTelemetry
from rlvitals.telemetry.process import build_registry
from rlvitals.telemetry.recorder import Recorder
from rlvitals.training import make_learner, make_network, ppo_settings, seed_everything

CPU = torch.device("cpu")


class CapturingTelemetry(RecorderTelemetry):
    """Telemetry over a real Recorder (no endpoint) that also keeps every stats dict the run records."""

    def __init__(self, level: str = "standard"):
        self.recorder = Recorder(level, "local")
        super().__init__(self.recorder)
        self.registry = build_registry(self.recorder)
        self.stats: list[dict] = []

    def record_learn(self, stats: dict) -> None:
        self.stats.append(dict(stats))
        super().record_learn(stats)


def probe_learner(env_id: str, seed: int = 0, **settings):
    """(runner, net, learner) for a probe env with the doctor's settings; CPU, one thread."""
    cfg = probe_config(env_id, seed, "unused")
    seed_everything(seed, 1)
    runner = EnvRunner(env_id, cfg.num_envs, seed)
    net = make_network(cfg, runner.obs_space, runner.action_space)
    learner = PPOLearner(net, dataclasses.replace(ppo_settings(cfg), **settings), CPU, seed)
    return cfg, runner, net, learner


def learn_one_batch(env_id: str, set_weights) -> dict:
    """Stats of one learner update on a probe, after `set_weights(net)` under no_grad."""
    cfg, runner, net, learner = probe_learner(env_id)
    with torch.no_grad():
        set_weights(net)
    try:
        return learner.learn(runner.collect(net, cfg.rollout_length))
    finally:
        runner.close()


def _zero(layer) -> None:
    layer.weight.zero_()
    layer.bias.zero_()


def test_relative_entropy_is_one_for_a_uniform_policy():
    stats = learn_one_batch("rlvitals/Probe4-v0", lambda net: _zero(net.policy_out))
    assert stats["relative_entropy"] == pytest.approx(1.0, abs=1e-6)
    # A confident policy is far from 1.
    stats = learn_one_batch("rlvitals/Probe4-v0", lambda net: net.policy_out.bias.copy_(torch.tensor([0.0, 8.0])))
    assert 0 < stats["relative_entropy"] < 0.01


def test_kl_is_zero_when_behaviour_and_learner_params_are_identical():
    # One epoch, one minibatch: the KL is measured with the very parameters that acted.
    # Probe 5's observations are +1/-1, so the policy differs between them.
    cfg, runner, net, learner = probe_learner("rlvitals/Probe5-v0", update_epochs=1, num_minibatches=1)
    with torch.no_grad():
        net.policy_out.weight.mul_(100.0)  # a far from uniform policy, so KL could be large
        net.policy_out.bias.copy_(torch.tensor([0.5, -0.5]))
    try:
        rollout = runner.collect(net, cfg.rollout_length)
        assert rollout.behaviour_params.std() > 0
        stats = learner.learn(rollout)
        assert stats["kl"] == pytest.approx(0.0, abs=1e-6)
        assert stats["kl"] >= 0
        # Learning on stale experience: several epochs after the behaviour policy, KL is positive.
        learner.s.update_epochs, learner.s.num_minibatches = 4, 4
        learner.set_learning_rate(0.05)
        stats = learner.learn(runner.collect(net, cfg.rollout_length))
        assert stats["kl"] > 1e-4
    finally:
        runner.close()


def test_kl_is_exact_and_never_negative():
    g = torch.Generator().manual_seed(0)
    cat = Categorical(5)
    p = torch.randn(2000, 5, generator=g) * 3
    q = torch.randn(2000, 5, generator=g) * 3
    near = p + 1e-7 * torch.randn(2000, 5, generator=g)
    assert (cat.kl(p, p) == 0).all()
    for other in (q, near):
        kl = cat.kl(p, other)
        assert (kl >= 0).all()
        ref = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=p),
                                                torch.distributions.Categorical(logits=other))
        torch.testing.assert_close(kl, ref.clamp_min(0), atol=1e-5, rtol=1e-4)
    import gymnasium as gym

    gauss = DiagGaussian(gym.spaces.Box(-1.0, 1.0, shape=(3,)))
    p = torch.randn(2000, 6, generator=g)
    q = torch.randn(2000, 6, generator=g)
    near = p + 1e-7 * torch.randn(2000, 6, generator=g)
    assert (gauss.kl(p, p) == 0).all()
    for other in (q, near):
        kl = gauss.kl(p, other)
        assert (kl >= 0).all()
        dist = lambda x: torch.distributions.Independent(  # noqa: E731
            torch.distributions.Normal(x[:, :3], x[:, 3:].exp()), 1)
        ref = torch.distributions.kl_divergence(dist(p), dist(other))
        torch.testing.assert_close(kl, ref.clamp_min(0), atol=1e-5, rtol=1e-4)


def test_residual_variance_is_one_for_a_value_net_that_explains_nothing():
    # Probe 3's targets are +1/-1: varied. A value head that outputs 0 explains none of it.
    stats = learn_one_batch("rlvitals/Probe3-v0", lambda net: _zero(net.value_out))
    assert stats["residual_variance"] == pytest.approx(1.0, abs=1e-6)
    # An untrained, randomly initialised net on CartPole's varied returns: near 1 as well.
    cfg = TrainConfig(env="CartPole-v1", progress=False).validate()
    seed_everything(0, 1)
    runner = EnvRunner(cfg.env, cfg.num_envs, 0)
    net = make_network(cfg, runner.obs_space, runner.action_space)
    try:
        stats = make_learner(cfg, net, CPU).learn(runner.collect(net, cfg.rollout_length))
    finally:
        runner.close()
    assert stats["residual_variance"] == pytest.approx(1.0, abs=0.05)


def train_probe(env_id: str, tmp_path: Path, **overrides) -> tuple[CapturingTelemetry, TrainConfig]:
    """A synchronous local run on a probe (doctor settings) recording through a real Recorder."""
    cfg = dataclasses.replace(probe_config(env_id, 0, str(tmp_path / env_id.replace("/", "-"))),
                              device="cpu", **overrides)
    telemetry = CapturingTelemetry("standard")
    train_in(cfg, ["test"], telemetry)
    return telemetry, cfg


def test_probe3_run_learns_its_value_and_is_never_stale(tmp_path):
    telemetry, cfg = train_probe("rlvitals/Probe3-v0", tmp_path)
    stats = telemetry.stats
    assert len(stats) > 10
    # Synchronous local mode: every batch is learned by the network that collected it.
    assert [s["staleness"] for s in stats] == [0.0] * len(stats)
    get = telemetry.registry.get_sample_value
    total = sum(s["samples"] for s in stats)
    name = "rlvitals_learner_sample_staleness_steps"
    assert get(f"{name}_bucket", {"le": "0.0"}) == get(f"{name}_count") == total
    assert get(f"{name}_sum") == 0
    # The value of obs +1/-1 is +1/-1: learned, the value net explains the targets.
    assert stats[-1]["residual_variance"] < 0.01
    assert get("rlvitals_learner_residual_variance_ratio") == pytest.approx(stats[-1]["residual_variance"])
    assert stats[0]["residual_variance"] > stats[-1]["residual_variance"]
    assert get("rlvitals_learner_training_intensity") == cfg.update_epochs


def test_probe1_residual_variance_is_undefined_but_its_value_is_learned(tmp_path):
    # Probe 1's value targets are all exactly 1: Var(targets) = 0, so the ratio is undefined
    # (NaN in the stats, no sample on /metrics) however well V = 1 is learned.
    telemetry, _ = train_probe("rlvitals/Probe1-v0", tmp_path, total_env_steps=6000)
    stats = telemetry.stats
    assert all(math.isnan(s["residual_variance"]) for s in stats)
    assert telemetry.registry.get_sample_value("rlvitals_learner_residual_variance_ratio") is None
    assert stats[-1]["value_mean"] == pytest.approx(1.0, abs=0.05)
    assert stats[-1]["target_std"] == pytest.approx(0.0, abs=1e-6)
    assert all(s["staleness"] == 0.0 for s in stats)


def test_step_statistics_match_a_parameter_diff_by_hand():
    cfg = TrainConfig(env="CartPole-v1", progress=False).validate()
    seed_everything(0, 1)
    runner = EnvRunner(cfg.env, cfg.num_envs, 0)
    net = make_network(cfg, runner.obs_space, runner.action_space)
    learner = make_learner(cfg, net, CPU)
    try:
        for _ in range(2):
            rollout = runner.collect(net, cfg.rollout_length)
            before = torch.cat([p.detach().reshape(-1).clone() for p in net.parameters()])
            stats = learner.learn(rollout)
            after = torch.cat([p.detach().reshape(-1).clone() for p in net.parameters()])
            delta = after.double() - before.double()
            assert delta.abs().max() > 0
            assert stats["step_absmax"] == pytest.approx(delta.abs().max().item(), rel=1e-6)
            assert stats["step_meansq"] == pytest.approx(delta.pow(2).mean().item(), rel=1e-6)
    finally:
        runner.close()
