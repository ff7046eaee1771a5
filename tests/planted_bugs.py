"""Classic RL bugs, planted from outside the product code, and the component a diagnosis must name.

Each bug is applied with a `pytest.MonkeyPatch` (so the product code stays
correct) around the seams a real bug would sit at: what a rollout holds when
it leaves the actor, the returns the learner computes, the loss, the network's
heads, the optimizer, weight publishing. `tests/test_diagnosis.py` runs a
representative subset; `bench/diagnosis.py` runs every bug and tabulates which
channel caught it, the component named and the seconds to the first verdict.

Channels: `run` = the health rules evaluated live on a CartPole run's rows
(fast rules and the actor-learner consistency check); `doctor` = the probe
ladder (`rlvitals doctor`), for bugs a healthy-looking CartPole curve hides.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch


@dataclass(frozen=True)
class PlantedBug:
    name: str
    component: str
    """The component a correct diagnosis names (telemetry.verdicts.COMPONENTS)."""
    channel: str
    """`run` or `doctor`: where it is expected to be caught."""
    apply: Callable[[pytest.MonkeyPatch], None]
    overrides: dict = field(default_factory=dict)
    """Config fields of the run (a user's settings that expose the bug)."""
    mode: str = "local"
    what: str = ""


def _after_collect(mp: pytest.MonkeyPatch, change: Callable) -> None:
    """Change every rollout as it leaves the env runner (what the actor stores)."""
    from rlvitals.actors.runner import EnvRunner

    original = EnvRunner.collect

    @functools.wraps(original)
    def collect(self, policy, num_steps):
        rollout = original(self, policy, num_steps)
        change(rollout)
        return rollout

    mp.setattr(EnvRunner, "collect", collect)


def _wrap_vtrace(mp: pytest.MonkeyPatch, change: Callable) -> None:
    from rlvitals.learner import ppo

    original = ppo.vtrace

    def vtrace(values, next_values, rewards, terminated, done, log_rhos, gamma, lam, rho_clip, c_clip, valid):
        return original(*change(values, next_values, rewards, terminated, done, log_rhos, gamma, lam, rho_clip,
                                c_clip, valid))

    mp.setattr(ppo, "vtrace", vtrace)


def _wrap_loss(mp: pytest.MonkeyPatch, change: Callable) -> None:
    from rlvitals.learner import ppo

    original = ppo.ppo_loss

    def ppo_loss(logp, behaviour_logp, values, advantages, value_targets, entropy, s):
        return original(*change(logp, behaviour_logp, values, advantages, value_targets, entropy, s))

    mp.setattr(ppo, "ppo_loss", ppo_loss)


# ---------------------------------------------------------------- the bugs


def truncation_as_termination(mp):
    def change(r):
        r.terminated = r.terminated | r.truncated

    _after_collect(mp, change)


def advantage_carry_not_reset(mp):
    # The naive loop: nothing cuts the recursion at an episode's end or at the reset transition.
    def change(values, next_values, rewards, terminated, done, log_rhos, gamma, lam, rho, c, valid):
        return (values, next_values, rewards, terminated, torch.zeros_like(done), log_rhos, gamma, lam, rho, c,
                torch.ones_like(valid))

    _wrap_vtrace(mp, change)


def rewards_one_step_late(mp):
    def change(r):
        r.rewards = torch.roll(r.rewards, 1, dims=0)

    _after_collect(mp, change)


def observations_one_step_early(mp):
    def change(r):
        r.obs = torch.cat([r.obs[1:], r.obs[-1:]])   # obs[t] := obs[t+1]: stored after the step, not before

    _after_collect(mp, change)


def preprocessing_learner_only(mp):
    def change(r):
        if r.obs.dtype.is_floating_point:
            r.obs = r.obs * 2.0 + 0.5                  # a normalisation the actor never applied

    _after_collect(mp, change)


def value_head_no_gradient(mp):
    from rlvitals.learner.networks import ActorCritic

    original = ActorCritic.value
    mp.setattr(ActorCritic, "value", lambda self, obs: original(self, obs).detach())


def entropy_bonus_sign_flipped(mp):
    _wrap_loss(mp, lambda logp, blogp, v, adv, tgt, ent, s: (logp, blogp, v, adv, tgt, -ent, s))


def policy_ratio_inverted(mp):
    # pi/mu computed as mu/pi: every update makes good actions less likely.
    _wrap_loss(mp, lambda logp, blogp, v, adv, tgt, ent, s: (blogp, logp, v, adv, tgt, ent, s))


def value_loss_ascends(mp):
    from rlvitals.learner import ppo

    original = ppo.ppo_loss

    def ppo_loss(logp, behaviour_logp, values, advantages, value_targets, entropy, s):
        loss, parts = original(logp, behaviour_logp, values, advantages, value_targets, entropy, s)
        return loss - 2 * s.value_coef * parts["value_loss"], parts   # + c*L_V became - c*L_V

    mp.setattr(ppo, "ppo_loss", ppo_loss)


def advantages_normalised_wrong_shape(mp):
    # [B] advantages turned into a [B, 1] column: the surrogate broadcasts to [B, B] and averages them away.
    _wrap_loss(mp, lambda logp, blogp, v, adv, tgt, ent, s: (logp, blogp, v, adv.unsqueeze(-1), tgt, ent, s))


def discount_ignored(mp):
    def change(values, next_values, rewards, terminated, done, log_rhos, gamma, lam, rho, c, valid):
        return values, next_values, rewards, terminated, done, log_rhos, 1.0, lam, rho, c, valid

    _wrap_vtrace(mp, change)


def kl_compares_the_wrong_distributions(mp):
    from rlvitals.learner.networks import Categorical, DiagGaussian

    for cls in (Categorical, DiagGaussian):
        original = cls.kl
        mp.setattr(cls, "kl", lambda self, p, q, _kl=original: _kl(self, p, p))   # KL(p || p) = 0


def optimizer_state_reset_every_step(mp):
    original = torch.optim.Adam.step

    def step(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        self.state.clear()                            # Adam's moments forgotten: every step is its first
        return out

    mp.setattr(torch.optim.Adam, "step", step)


def gradients_never_zeroed(mp):
    # zero_grad does nothing: every backward adds to the gradients of all the steps before it.
    mp.setattr(torch.optim.Adam, "zero_grad", lambda self, set_to_none=True: None)


def actions_stored_one_step_late(mp):
    def change(r):
        r.actions = torch.roll(r.actions, 1, dims=0)   # a_t := a_{t-1}: the log-probabilities stay with a_t

    _after_collect(mp, change)


KEPT: list = []


def rollouts_kept_forever(mp):
    KEPT.clear()
    _after_collect(mp, KEPT.append)


def weights_never_republished(mp):
    from rlvitals.distributed.fleet import Fleet

    original = Fleet.publish

    def publish(self, net):
        # The first version goes out, and never another. Kept per fleet: an object ref does not
        # outlive the Ray session that made it (the doctor starts more than one).
        if not hasattr(self, "_planted_first_weights"):
            self._planted_first_weights = original(self, net)
        return self._planted_first_weights

    mp.setattr(Fleet, "publish", publish)


def actor_parameters_not_loaded(mp):
    from rlvitals.distributed.fleet import Fleet

    def publish(self, net):
        # What actors get is the learner's state with its first parameters: they take on each new network
        # age (a buffer) but keep acting with the first weights, as a partial load would leave them.
        state = {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}
        if not hasattr(self, "_planted_first_parameters"):
            self._planted_first_parameters = {k: state[k] for k, _ in net.named_parameters()}
        return [self.ray.put({**state, **self._planted_first_parameters})], net.age

    mp.setattr(Fleet, "publish", publish)


def no_bug(mp):
    pass


BUGS: tuple[PlantedBug, ...] = (
    PlantedBug("truncation_as_termination", "returns", "doctor", truncation_as_termination,
               what="time-limit truncation stored as termination: no bootstrap at the limit"),
    PlantedBug("advantage_carry_not_reset", "returns", "doctor", advantage_carry_not_reset,
               what="GAE/V-trace recursion not cut at episode boundaries"),
    PlantedBug("rewards_one_step_late", "actor", "doctor", rewards_one_step_late,
               what="each reward stored with the step after the one that earned it"),
    PlantedBug("optimizer_state_reset_every_step", "optimizer", "doctor", optimizer_state_reset_every_step,
               what="Adam's moment estimates cleared after every step"),
    PlantedBug("observations_one_step_early", "actor", "run", observations_one_step_early,
               what="observation stored after the step instead of before it"),
    PlantedBug("preprocessing_learner_only", "preprocessing", "run", preprocessing_learner_only,
               what="an observation transform the learner applies and the actor does not"),
    PlantedBug("value_head_no_gradient", "value", "run", value_head_no_gradient,
               what="values detached from the graph: the value loss trains nothing"),
    PlantedBug("entropy_bonus_sign_flipped", "policy", "run", entropy_bonus_sign_flipped,
               overrides={"entropy_coef": 0.1}, what="entropy bonus subtracted: with a user's large coefficient "
                                                      "it drives the policy deterministic"),
    PlantedBug("policy_ratio_inverted", "policy", "run", policy_ratio_inverted,
               what="the probability ratio computed as behaviour / learner: the surrogate climbs the wrong way"),
    PlantedBug("value_loss_ascends", "value", "run", value_loss_ascends,
               what="the value loss subtracted instead of added: values are pushed away from their targets"),
    PlantedBug("gradients_never_zeroed", "optimizer", "run", gradients_never_zeroed,
               what="the optimizer's zero_grad does nothing: gradients accumulate over every step"),
    PlantedBug("actions_stored_one_step_late", "actor", "run", actions_stored_one_step_late,
               what="each stored action is the previous step's, while its log-probability is this step's"),
    PlantedBug("advantages_normalised_wrong_shape", "policy", "run", advantages_normalised_wrong_shape,
               what="advantages broadcast as a column: the surrogate averages them to zero"),
    PlantedBug("learning_rate_100x", "optimizer", "run", no_bug, overrides={"learning_rate": 0.25},
               what="a learning rate 100 times the tuned one"),
    PlantedBug("discount_ignored", "returns", "run", discount_ignored,
               what="returns summed without discounting (gamma taken as 1)"),
    PlantedBug("kl_compares_the_wrong_distributions", "telemetry", "run", kl_compares_the_wrong_distributions,
               what="the KL diagnostic compares the behaviour policy with itself"),
    PlantedBug("weights_never_republished", "weight-sync", "run", weights_never_republished,
               overrides={"mode": "ray", "num_actors": 2, "torch_threads": 1}, mode="ray",
               what="Ray mode: the learner's new weights never reach the actors"),
    PlantedBug("actor_parameters_not_loaded", "weight-sync", "run", actor_parameters_not_loaded,
               overrides={"mode": "ray", "num_actors": 2, "torch_threads": 1}, mode="ray",
               what="Ray mode: actors take each new network age but keep their first parameters"),
    PlantedBug("rollouts_kept_forever", "memory", "run", rollouts_kept_forever,
               what="every rollout appended to a list that is never cleared"),
)

BY_BUG = {b.name: b for b in BUGS}
