"""Planted faults in the learner's stages: the distribution, what the
returns hand to the losses, and the optimizer's step: each breaks one stage's output given its own inputs
(issue 31), planted from outside the product code.

Three shapes the first verdict used to get wrong: a formula that actor and learner share (both agree with each
other, so only a reference outside the product sees it, and the formula's owner must be named, not the actor
that records with it nor the telemetry that reports through it); a value handed wrongly between two correct
parts (the consumer is named, not the producer); an optimizer whose step is not the configured one while its
learning rate and step counts read right.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from planted_bug import PlantedBug

PENDULUM = "Pendulum-v1"
RAY = {"mode": "ray", "num_actors": 2, "torch_threads": 1}


# ---------------------------------------------------------------- formulas actor and learner share


def gaussian_log_prob_without_the_normaliser(mp):
    from rlvitals.learner.networks import DiagGaussian

    def log_prob(self, params, actions):
        # The classic slip: -log sigma left out of the density (sampling, done apart, stays right).
        mean, log_std = self._split(params)
        z = (actions - mean) / log_std.exp()
        return (-0.5 * z.pow(2) - 0.5 * math.log(2 * math.pi)).sum(-1)

    mp.setattr(DiagGaussian, "log_prob", log_prob)


def categorical_log_prob_at_half_temperature(mp):
    from torch.nn import functional as F

    from rlvitals.learner.networks import Categorical

    # Log-probabilities of softmax(logits / 2) for every caller, while actions are still drawn from softmax(logits).
    mp.setattr(Categorical, "log_prob", lambda self, params, actions: F.log_softmax(params / 2, -1).gather(
        -1, actions.long().unsqueeze(-1)).squeeze(-1))


def gaussian_kl_without_the_variance_ratio(mp):
    from rlvitals.learner.networks import DiagGaussian

    def kl(self, p_params, q_params):
        mp_, lp = self._split(p_params)
        mq, lq = self._split(q_params)
        return (lq - lp + (mp_ - mq).pow(2) / (2 * torch.exp(2 * lq))).sum(-1).clamp_min(0.0)

    mp.setattr(DiagGaussian, "kl", kl)


# ---------------------------------------------------------------- a value handed wrongly between correct parts


def _batch_changed(mp, change) -> None:
    """The learner's batch as `_arrive` built it, changed before the minibatch steps: change(batch) -> batch."""
    from rlvitals.learner.ppo import PPOLearner

    original = PPOLearner._arrive

    def _arrive(self, r, index, staleness):
        return change(original(self, r, index, staleness))

    mp.setattr(PPOLearner, "_arrive", _arrive)


def value_loss_handed_targets_of_the_previous_sample(mp):
    # The flattened targets taken one sample off: each value regresses on its neighbour's target.
    _batch_changed(mp, lambda b: dataclasses.replace(b, mb_targets=torch.roll(b.mb_targets, 1, 0)))


def policy_loss_handed_unnormalised_rewards_as_advantages(mp):
    # The policy loss is handed the rewards where the advantages belong (a field copied from the wrong array).
    def change(b):
        T, N = b.rewards.shape
        rewards = b.rewards.reshape(T * N)[b.valid.reshape(T * N)]
        return dataclasses.replace(b, mb_adv=rewards.to(b.mb_adv.dtype))

    _batch_changed(mp, change)


def observation_statistics_of_normalised_observations(mp):
    from rlvitals.learner.normalize import ObservationNormalizer

    original = ObservationNormalizer.update
    # The statistics are fed the observations after normalising them: they drift towards mean 0, variance 1 of
    # their own output instead of the raw stream's.
    mp.setattr(ObservationNormalizer, "update", lambda self, obs: original(self, self(obs)))


def reward_divisor_from_the_rewards_own_spread(mp):
    from rlvitals.learner.normalize import ReturnScaler

    original = ReturnScaler.scale

    def scale(self, rewards, returns, valid):
        # The running statistics are fed the rewards where the discounted returns belong.
        return original(self, rewards, rewards, valid)

    mp.setattr(ReturnScaler, "scale", scale)


def running_return_never_reset(mp):
    from rlvitals.actors.runner import EnvRunner

    original = EnvRunner.collect

    def collect(self, policy, num_steps):
        # The running discounted return is carried across episode ends: the slot that resets it is lost.
        kept = self.discounted_return.copy()
        rollout = original(self, policy, num_steps)
        if rollout.discounted_returns is not None:
            T = rollout.rewards.shape[0]
            carry, out = kept, rollout.discounted_returns.clone()
            for t in range(T):
                live = rollout.valid[t].numpy()
                carry = carry * self.return_discount + rollout.rewards[t].numpy() * live
                out[t] = torch.from_numpy(carry.astype("float32"))
            rollout.discounted_returns = out
            self.discounted_return = carry
        return rollout

    mp.setattr(EnvRunner, "collect", collect)


def actor_acts_on_each_env_first(mp):
    from rlvitals.actors.runner import EnvRunner

    original = EnvRunner._act

    def _act(self, policy, obs):
        # A per-env loop left in before the batched call (its draws are thrown away): right actions, and the
        # work of one forward pass per env on every step.
        for row in range(obs.shape[0]):
            policy.act(torch.as_tensor(obs[row: row + 1]))
        return original(self, policy, obs)

    mp.setattr(EnvRunner, "_act", _act)


def value_head_squashed(mp):
    from rlvitals.learner.networks import ActorCritic

    original = ActorCritic._value
    # A tanh on the value output: values live in (-1, 1) while CartPole's targets reach tens.
    mp.setattr(ActorCritic, "_value", lambda self, x: torch.tanh(original(self, x)))


# ---------------------------------------------------------------- the optimizer's step


def adam_with_other_betas(mp):
    original = torch.optim.Adam

    class Adam(original):
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), **kwargs):
            super().__init__(params, lr=lr, betas=(0.5, 0.9), **kwargs)   # a "faster" Adam, set where it is built

    mp.setattr(torch.optim, "Adam", Adam)


def adam_step_scaled_inside(mp):
    # The step applies three times the group's rate and sets it back: the rate every reader sees is right.
    original = torch.optim.Adam.step

    def step(self, closure=None):
        rates = [group["lr"] for group in self.param_groups]
        for group in self.param_groups:
            group["lr"] = group["lr"] * 3
        try:
            return original(self, closure)
        finally:
            for group, lr in zip(self.param_groups, rates, strict=True):
                group["lr"] = lr

    mp.setattr(torch.optim.Adam, "step", step)


def adam_second_moment_frozen(mp):
    # The second moment keeps its first value: later steps divide by a stale scale.
    original = torch.optim.Adam.step

    def step(self, closure=None):
        kept = {p: state["exp_avg_sq"].clone() for p, state in self.state.items() if "exp_avg_sq" in state}
        out = original(self, closure)
        for p, v in kept.items():
            self.state[p]["exp_avg_sq"].copy_(v)
        return out

    mp.setattr(torch.optim.Adam, "step", step)


# ---------------------------------------------------------------- what the learner received


def batch_received_at_half_precision(mp):
    """The learner's transfer rounds every float [T, N] tensor to float16 and back: rewards and the behaviour
    log-probabilities it learns from are not the ones the actors recorded."""
    from rlvitals.learner import ppo

    original = ppo.to_device

    def to_device(x, dev):
        out = original(x, dev)
        return out.half().to(out.dtype) if out.dtype == torch.float32 and out.dim() == 2 else out

    mp.setattr(ppo, "to_device", to_device)


def every_batch_learned_twice(mp):
    """The learner is called twice on each batch (a retry left in): its samples count once and train twice."""
    from rlvitals.learner.ppo import PPOLearner

    original = PPOLearner.learn

    def learn(self, rollout):
        original(self, rollout)
        return original(self, rollout)

    mp.setattr(PPOLearner, "learn", learn)


# ---------------------------------------------------------------- the network's age


def network_age_counted_per_update(mp):
    """The network's age rises by one per update, not one per optimizer step: every sample's stamp, the weights'
    versions and the staleness are counted in the wrong unit."""
    from rlvitals.learner.ppo import PPOLearner

    original = PPOLearner._update

    def _update(self, b):
        age = self.net.age
        out = original(self, b)
        self.net.age = age + 1
        return out

    mp.setattr(PPOLearner, "_update", _update)


LEARNER_STAGE_BUGS: tuple[PlantedBug, ...] = (
    PlantedBug("gaussian_log_prob_without_the_normaliser", "policy", "run", gaussian_log_prob_without_the_normaliser,
               env=PENDULUM, invariant="distribution_as_defined",
               what="the diagonal Gaussian's log-density leaves out -log sigma, for actor and learner alike"),
    PlantedBug("categorical_log_prob_at_half_temperature", "policy", "run", categorical_log_prob_at_half_temperature,
               invariant="distribution_as_defined",
               what="log-probabilities of softmax(logits / 2) while actions are drawn from softmax(logits)"),
    PlantedBug("gaussian_kl_without_the_variance_ratio", "telemetry", "run", gaussian_kl_without_the_variance_ratio,
               env=PENDULUM, invariant="telemetry_recomputed",
               what="the Gaussian KL, which only the KL diagnostic uses, leaves out sigma_p^2 / sigma_q^2 - 1"),
    PlantedBug("ray_gaussian_log_prob_without_the_normaliser", "policy", "run",
               gaussian_log_prob_without_the_normaliser, env=PENDULUM, overrides=RAY, mode="ray", in_actors=True,
               invariant="distribution_as_defined",
               what="Ray mode: the shared Gaussian log-density without -log sigma, in actors and learner"),
    PlantedBug("value_loss_handed_targets_of_the_previous_sample", "value", "run",
               value_loss_handed_targets_of_the_previous_sample, invariant="value_loss_inputs",
               what="the returns are right; the value loss is handed each sample's neighbour's target"),
    PlantedBug("policy_loss_handed_rewards_as_advantages", "policy", "run",
               policy_loss_handed_unnormalised_rewards_as_advantages, env=PENDULUM, invariant="policy_loss_inputs",
               what="the returns are right; the policy loss is handed the rewards as advantages"),
    PlantedBug("ray_value_loss_handed_targets_of_the_previous_sample", "value", "run",
               value_loss_handed_targets_of_the_previous_sample, overrides=RAY, mode="ray",
               invariant="value_loss_inputs", what="Ray mode: the value loss is handed its neighbour's targets"),
    PlantedBug("observation_statistics_of_normalised_observations", "preprocessing", "run",
               observation_statistics_of_normalised_observations, env=PENDULUM,
               overrides={"normalize_observations": True}, invariant="observation_statistics_recomputed",
               what="the running observation statistics are fed the normalised observations, not the raw ones"),
    PlantedBug("reward_divisor_from_the_rewards_own_spread", "preprocessing", "run",
               reward_divisor_from_the_rewards_own_spread, env=PENDULUM, overrides={"normalize_rewards": True},
               invariant="reward_scaling_recomputed",
               what="reward normalisation divides by the running spread of the rewards, not of the returns"),
    PlantedBug("running_return_never_reset", "actor", "run", running_return_never_reset, env=PENDULUM,
               overrides={"normalize_rewards": True}, invariant="running_returns_recomputed",
               what="the actor's running discounted return (for reward scaling) is never reset at episode ends"),
    PlantedBug("actor_acts_on_each_env_first", "actor", "run", actor_acts_on_each_env_first, env="CartPole-v1",
               what="the actor acts on every env alone before its batched call: right actions, hidden work"),
    PlantedBug("value_head_squashed", "value", "run", value_head_squashed, invariant="value_head_affine",
               what="the value output squashed by tanh: it cannot represent targets beyond 1"),
    PlantedBug("adam_with_other_betas", "optimizer", "run", adam_with_other_betas,
               invariant="optimizer_step_as_configured", what="Adam built with betas (0.5, 0.9), not the configured"),
    PlantedBug("adam_step_scaled_inside", "optimizer", "run", adam_step_scaled_inside, env=PENDULUM,
               invariant="optimizer_step_as_configured",
               what="each step applies 3x the learning rate its group reads"),
    PlantedBug("adam_second_moment_frozen", "optimizer", "run", adam_second_moment_frozen,
               invariant="optimizer_step_as_configured", what="Adam's second moment never updated after it is made"),
    PlantedBug("ray_adam_with_other_betas", "optimizer", "run", adam_with_other_betas, overrides=RAY, mode="ray",
               invariant="optimizer_step_as_configured", what="Ray mode: the learner's Adam with betas (0.5, 0.9)"),
    PlantedBug("batch_received_at_half_precision", "learner", "run", batch_received_at_half_precision,
               env=PENDULUM, invariant="received_as_sent",
               what="the learner's transfer rounds the batch's float tensors to float16 (the actors' records right)"),
    PlantedBug("ray_batch_received_at_half_precision", "learner", "run", batch_received_at_half_precision,
               overrides=RAY, mode="ray", invariant="received_as_sent",
               what="as batch_received_at_half_precision, in Ray mode"),
    PlantedBug("every_batch_learned_twice", "learner", "run", every_batch_learned_twice,
               invariant="learned_once", what="the learner is called twice on every batch"),
    PlantedBug("network_age_counted_per_update", "learner", "run", network_age_counted_per_update,
               env=PENDULUM, invariant="network_age_counted",
               what="the network's age rises by one per update instead of one per optimizer step"),
    PlantedBug("ray_network_age_counted_per_update", "learner", "run", network_age_counted_per_update,
               overrides=RAY, mode="ray", invariant="network_age_counted",
               what="as network_age_counted_per_update, in Ray mode (the stamps the actors' weights carry)"),
)
