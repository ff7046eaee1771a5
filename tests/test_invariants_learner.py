"""The learner's invariant statistics (learner/invariants/) on real rollouts: they hold on healthy data, and each
is driven over its limit (telemetry/invariants.py) by a fault that breaks exactly its invariant.

Rollouts come from real gymnasium envs through the real EnvRunner; faults are monkeypatches around the seams a
real bug would sit at (the actor's sampler, what a rollout holds after collect, `ppo.vtrace`, `ppo.ppo_loss`,
the optimizer, the diagnostics as the learner calls them), never edits of product code. The reference V-trace
is checked against cases worked by hand and against `returns.vtrace` on random rollouts.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from planted_bugs import BY_BUG, _after_collect
from test_diagnostics import CapturingTelemetry
from test_returns import random_rollout

from rlvitals.actors.runner import EnvRunner
from rlvitals.config import TrainConfig
from rlvitals.learner import diagnostics, ppo
from rlvitals.learner.invariants import KEYS, is_sampled
from rlvitals.learner.networks import Categorical, DiagGaussian
from rlvitals.learner.ppo import PPOLearner
from rlvitals.learner.reference_returns import vtrace_reference
from rlvitals.learner.returns import vtrace
from rlvitals.session import train_in
from rlvitals.telemetry.invariants import BY_NAME
from rlvitals.training import make_network, ppo_settings, seed_everything

CPU = torch.device("cpu")
F64 = torch.float64
LIMIT = {f"inv_{name}": inv.limit for name, inv in BY_NAME.items()}
PENDULUM = {"gamma": 0.9, "learning_rate": 1e-3, "gae_lambda": 0.95}   # the healthy set's Pendulum settings


def run_updates(env_id: str = "CartPole-v1", updates: int = 3, prefer: float = 0.0, num_envs: int = 8,
                rollout_length: int = 128, prepare=None, **settings) -> list[dict]:
    """Stats of `updates` learner updates on fresh rollouts of a real env (CPU, seed 0).

    `prefer` is added to the first action's logit (discrete actions): a policy far from uniform makes every
    action's probability matter. `prepare(learner)` changes the learner before the first update (a fault's fixture).
    """
    overrides = {k: settings.pop(k) for k in ("gamma", "learning_rate", "gae_lambda") if k in settings}
    cfg = TrainConfig(env=env_id, progress=False, num_envs=num_envs, rollout_length=rollout_length,
                      device="cpu", **overrides).validate()
    seed_everything(0, 1)
    runner = EnvRunner(env_id, num_envs, 0)
    net = make_network(cfg, runner.obs_space, runner.action_space)
    if prefer:
        with torch.no_grad():
            net.policy_out.bias[0] += prefer
    learner = PPOLearner(net, dataclasses.replace(ppo_settings(cfg), **settings), CPU, 0)
    if prepare is not None:
        prepare(learner)
    try:
        return [learner.learn(runner.collect(net, cfg.rollout_length)) for _ in range(updates)]
    finally:
        runner.close()


def measured(stats: list[dict], key: str) -> list[float]:
    return [s[key] for s in stats if not math.isnan(s[key])]


def assert_healthy(stats: list[dict], skip=()) -> None:
    for key in KEYS:
        if key not in skip:
            assert all(v <= LIMIT[key] for v in measured(stats, key)), (key, measured(stats, key))


# ----------------------------------------------------------------- the reference V-trace


def test_reference_vtrace_hand_worked_off_policy_with_lambda():
    """gamma = 0.5, lambda = 0.5, rho_bar = c_bar = 1, one env, no episode end.

        V(x_t) = [2, 4, 1],  V(x_{t+1}) = [4, 1, 2],  r = [1, 2, 2],  pi/mu = [0.5, 2, 1]
        rho = min(1, pi/mu) = [0.5, 1, 1];   c = lambda min(1, pi/mu) = [0.25, 0.5, 0.5]
        delta_0 = 1 + 0.5*4 - 2 = 1;   delta_1 = 2 + 0.5*1 - 4 = -1.5;   delta_2 = 2 + 0.5*2 - 1 = 2
        v_2 - V_2 = rho_2 delta_2                          = 2                      -> v_2 = 3
        v_1 - V_1 = rho_1 delta_1 + g c_1 (v_2 - V_2)      = -1.5 + 0.5*0.5*2 = -1  -> v_1 = 3
        v_0 - V_0 = rho_0 delta_0 + g c_0 (v_1 - V_1)      = 0.5 + 0.5*0.25*-1      -> v_0 = 2.375
        A_2 = delta_2 = 2   (the rollout ends)
        A_1 = delta_1 + g lam (v_2 - V_2) = -1.5 + 0.25*2  = -1
        A_0 = delta_0 + g lam (v_1 - V_1) = 1 + 0.25*-1    = 0.75   (no c_0: a_0 is given)
    """
    col = lambda *x: torch.tensor(x, dtype=F64).unsqueeze(-1)  # noqa: E731
    no = torch.zeros(3, 1, dtype=torch.bool)
    vs, adv = vtrace_reference(col(2, 4, 1), col(4, 1, 2), col(1, 2, 2), no, no, ~no,
                               torch.log(col(0.5, 2, 1)), 0.5, 0.5, 1.0, 1.0)
    assert vs.squeeze(-1).tolist() == [2.375, 3.0, 3.0]
    assert adv.squeeze(-1).tolist() == [0.75, -1.0, 2.0]


def test_reference_vtrace_hand_worked_truncation_reset_and_termination():
    """gamma = 0.5, lambda = 1, clips 1. Step 0 is truncated (the true final V(x_1) = 8 bootstraps), step 1 is
    the reset transition (garbage, invalid), step 2 starts a new episode and terminates.

        V(x_t) = [2, 99, 1],  V(x_{t+1}) = [8, 77, 5],  r = [1, 33, 3],  pi/mu = [2, 1, 0.5]
        delta_0 = 1 + 0.5*8 - 2 = 3;   rho_0 = 1;   nothing follows a truncation   -> v_0 = 5,  A_0 = 3
        delta_2 = 3 + 0 - 1 = 2 (terminated: no bootstrap);   rho_2 = 0.5         -> v_2 = 2,  A_2 = 2
    """
    col = lambda *x: torch.tensor(x, dtype=F64).unsqueeze(-1)  # noqa: E731
    flag = lambda *x: torch.tensor(x, dtype=torch.bool).unsqueeze(-1)  # noqa: E731
    valid = flag(1, 0, 1)
    vs, adv = vtrace_reference(col(2, 99, 1), col(8, 77, 5), col(1, 33, 3), flag(0, 0, 1), flag(1, 0, 0), valid,
                               torch.log(col(2, 1, 0.5)), 0.5, 1.0, 1.0, 1.0)
    assert vs[valid].tolist() == [5.0, 2.0]
    assert adv[valid].tolist() == [3.0, 2.0]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("rho_clip,c_clip,lam", [(1.0, 1.0, 0.95), (2.0, 0.5, 1.0), (0.5, 1.5, 0.0)])
def test_reference_vtrace_matches_the_learners_on_random_rollouts(seed, rho_clip, c_clip, lam):
    d = random_rollout(seed, 40, 6)
    truncated = d["done"] & ~d["terminated"]
    ref_vs, ref_adv = vtrace_reference(d["values"], d["next_values"], d["rewards"], d["terminated"], truncated,
                                       d["valid"], d["log_rhos"], 0.9, lam, rho_clip, c_clip)
    vs, adv = vtrace(d["values"], d["next_values"], d["rewards"], d["terminated"], d["done"], d["log_rhos"], 0.9,
                     lam, rho_clip, c_clip, d["valid"])
    valid = d["valid"]
    torch.testing.assert_close(ref_vs[valid], vs[valid], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ref_adv[valid], adv[valid], rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------- healthy data


def test_sampling_schedule_counts_updates():
    assert [u for u in range(50) if is_sampled(u)] == [*range(16), 16, 32, 48]


@pytest.mark.parametrize("env_id,settings", [("CartPole-v1", {}), ("Pendulum-v1", PENDULUM)])
def test_every_statistic_holds_on_healthy_updates(env_id, settings):
    stats = run_updates(env_id, updates=4, prefer=1.5 if env_id == "CartPole-v1" else 0.0, **settings)
    assert_healthy(stats)
    for s in stats:   # exact checks read rounding, not a fraction of their limit
        assert s["inv_behaviour_record"] < 1e-4
        assert s["inv_returns_recomputed"] < 1e-5
        assert s["inv_loss_gradient_policy"] < 1e-5 and s["inv_loss_gradient_value"] < 1e-5
        assert s["inv_loss_gradient_entropy"] < 1e-5   # entropy_coef 0: the entropies' values alone
        assert s["inv_optimizer_coverage"] == 0 and s["inv_minibatch_coverage"] == 0
        assert s["inv_optimizer_state_kept"] == 0 and s["inv_gradient_clipped_as_configured"] < 1e-5
        assert s["inv_telemetry_recomputed"] < 1e-4
        assert s["inv_sampling_logp"] < 5 and s["inv_sampling_frequency"] < 5


def test_a_local_cartpole_run_records_every_statistic_and_they_hold(tmp_path):
    updates = 20
    cfg = TrainConfig(env="CartPole-v1", progress=False, num_envs=8, rollout_length=128, device="cpu",
                      total_env_steps=8 * 128 * updates, run_dir=str(tmp_path / "run")).validate()
    telemetry = CapturingTelemetry("standard")
    train_in(cfg, ["test"], telemetry)
    stats = [row for row in telemetry.stats if "updates" in row]    # the learner's rows, one per update
    assert len(stats) >= updates and all(set(KEYS) <= set(s) for s in stats)
    # The run's own judgement (its last row) holds every learner invariant.
    assert {key: telemetry.stats[-1][key.replace("inv_", "inv_broken_")] for key in KEYS} == dict.fromkeys(KEYS, 0.0)
    assert all(s["inv_learning_rate_as_configured"] == 0.0 for s in stats)   # set by the run, judged by it
    assert_healthy(stats)
    assert len(measured(stats, "inv_returns_recomputed")) == sum(is_sampled(u) for u in range(len(stats)))
    assert len(measured(stats, "inv_sampling_logp")) == sum(is_sampled(u) for u in range(len(stats)))
    assert len(measured(stats, "inv_optimizer_state_kept")) == len(stats)    # Python look-ups: every update


def test_healthy_statistics_with_the_entropy_bonus_and_raw_advantages():
    stats = run_updates(updates=2, entropy_coef=0.01, normalize_advantages=False)
    assert_healthy(stats)
    assert all(s["inv_loss_gradient_entropy"] < 1e-5 for s in stats)


def test_unsampled_updates_measure_only_the_cheap_statistics():
    stats = run_updates(updates=18, num_envs=2, rollout_length=32)
    assert_healthy(stats)
    sampled = [is_sampled(u) for u in range(18)]
    for key in ("inv_returns_recomputed", "inv_sampling_logp", "inv_loss_gradient_value", "inv_gradient_of_loss",
                "inv_gradient_clipped_as_configured", "inv_telemetry_recomputed", "inv_minibatch_coverage"):
        assert [not math.isnan(s[key]) for s in stats] == sampled, key
    assert math.isnan(stats[17]["inv_policy_starved"])
    assert all(not math.isnan(s["inv_optimizer_state_kept"]) for s in stats)


def test_learning_rate_zero_leaves_coverage_unjudged():
    # Annealing ends at 0: nothing may move then, so "did not move" says nothing.
    stats = run_updates(updates=2, prepare=lambda learner: learner.set_learning_rate(0.0))
    assert all(math.isnan(s["inv_optimizer_coverage"]) for s in stats)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bfloat16 autocast runs on CUDA only")
def test_loss_gradients_hold_under_mixed_precision():
    cfg = TrainConfig(env="CartPole-v1", progress=False, num_envs=8, rollout_length=128).validate()
    seed_everything(0, 1)
    runner = EnvRunner(cfg.env, cfg.num_envs, 0)
    net = make_network(cfg, runner.obs_space, runner.action_space)
    cuda = torch.device("cuda")
    learner = PPOLearner(net, dataclasses.replace(ppo_settings(cfg), mixed_precision=True, entropy_coef=0.01),
                         cuda, 0)
    assert learner.amp
    try:
        stats = []
        for _ in range(3):
            net.cpu()
            rollout = runner.collect(net, cfg.rollout_length)
            net.to(cuda)
            stats.append(learner.learn(rollout))
    finally:
        runner.close()
    assert_healthy(stats)
    for key in ("inv_loss_gradient_policy", "inv_loss_gradient_value", "inv_loss_gradient_entropy"):
        assert all(v < 0.05 for v in measured(stats, key)), (key, measured(stats, key))


# ----------------------------------------------------------------- faults, each breaking one invariant


def argmax_actor(mp):
    def sample(self, params, generator):
        actions = params.argmax(-1)
        return actions, self.log_prob(params, actions)

    mp.setattr(Categorical, "sample", sample)


def hot_actor(mp):
    # Draws at temperature 2 while recording the distribution at temperature 1.
    original = Categorical.sample
    mp.setattr(Categorical, "sample", lambda self, params, generator: (
        lambda a: (a, self.log_prob(params, a)))(original(self, params / 2, generator)[0]))


def narrow_gaussian_actor(mp):
    # Draws with half the recorded standard deviation.
    def sample(self, params, generator):
        mean, log_std = self._split(params)
        actions = mean + 0.5 * log_std.exp() * torch.randn(mean.shape, generator=generator)
        return actions, self.log_prob(params, actions)

    mp.setattr(DiagGaussian, "sample", sample)


def shifted_gaussian_actor(mp):
    # Draws around mean + 0.3 sigma, records the distribution around the mean.
    def sample(self, params, generator):
        mean, log_std = self._split(params)
        actions = mean + log_std.exp() * (0.3 + torch.randn(mean.shape, generator=generator))
        return actions, self.log_prob(params, actions)

    mp.setattr(DiagGaussian, "sample", sample)


def actions_remapped(mp):
    def change(r):
        r.actions = (r.actions + 1) % 2       # CartPole: the other action stored, the log-probability kept

    _after_collect(mp, change)


def discount_changed(mp):
    original = ppo.vtrace
    mp.setattr(ppo, "vtrace", lambda *a: original(*a[:6], a[6] * 0.9, *a[7:]))


def advantages_scaled(mp):
    original = ppo.ppo_loss
    mp.setattr(ppo, "ppo_loss", lambda lp, blp, v, adv, tgt, ent, s: original(lp, blp, v, 3 * adv, tgt, ent, s))


def parameter_left_out(learner):
    group = learner.optimizer.param_groups[0]
    group["params"] = [p for p in group["params"] if p is not learner.net.value_out.weight]


def step_undone(mp):
    original = torch.optim.Adam.step

    def step(self, *args, **kwargs):
        param = self.param_groups[0]["params"][0]
        kept = param.detach().clone()
        out = original(self, *args, **kwargs)
        with torch.no_grad():
            param.copy_(kept)                 # this parameter's step is undone
        return out

    mp.setattr(torch.optim.Adam, "step", step)


def rewards_huge(mp):
    def change(r):
        r.rewards = r.rewards * 1e6

    _after_collect(mp, change)


def residual_variance_swapped(mp):
    original = diagnostics.residual_variance
    mp.setattr(diagnostics, "residual_variance", lambda targets, values, mask, min_std=0.0:
               original(values, targets, mask, min_std))


@dataclasses.dataclass(frozen=True)
class Fault:
    apply: object
    breaks: tuple[str, ...]
    """Statistics over their limit on every update that measured them."""
    also: tuple[str, ...] = ()
    """Statistics the fault may move too (downstream of the same fault); every other one must hold."""
    env: str = "CartPole-v1"
    settings: dict = dataclasses.field(default_factory=dict)
    prepare: object = None
    prefer: float = 1.5
    """Added to the first action's initial logit (discrete actions)."""
    from_update: int = 0
    """The first update on which the fault can show."""


FAULTS = {
    "argmax_actor": Fault(argmax_actor, ("sampling_logp", "sampling_frequency")),
    # A near-uniform policy whose preferred action varies by state: argmax keeps the mean frequencies. The initial
    # policy is uniform to 1e-3 nats (tau): its argmax is indistinguishable from a draw until it has learned.
    "argmax_actor_balanced": Fault(argmax_actor, ("sampling_logp",), also=("sampling_frequency",), prefer=0.0,
                                   from_update=1),
    "hot_actor": Fault(hot_actor, ("sampling_logp",), also=("sampling_frequency",)),
    "narrow_gaussian_actor": Fault(narrow_gaussian_actor, ("sampling_logp",), env="Pendulum-v1",
                                   settings=PENDULUM),
    "shifted_gaussian_actor": Fault(shifted_gaussian_actor, ("sampling_frequency",), also=("sampling_logp",),
                                    env="Pendulum-v1", settings=PENDULUM),
    "actions_remapped": Fault(actions_remapped, ("behaviour_record",), also=("sampling_frequency",)),
    "discount_changed": Fault(discount_changed, ("returns_recomputed",)),
    "advantage_carry_not_reset": Fault(BY_BUG["advantage_carry_not_reset"].apply, ("returns_recomputed",)),
    # A loss off its surrogate also reports another mean loss than the configured surrogate's (same component).
    "advantages_scaled": Fault(advantages_scaled, ("loss_gradient_policy",), also=("policy_loss_as_configured",),
                               settings={"normalize_advantages": False}),
    "policy_ratio_inverted": Fault(BY_BUG["policy_ratio_inverted"].apply, ("loss_gradient_policy",),
                                   also=("policy_loss_as_configured",)),
    "values_detached": Fault(BY_BUG["value_head_no_gradient"].apply, ("loss_gradient_value",)),
    "value_loss_ascends": Fault(BY_BUG["value_loss_ascends"].apply, ("loss_gradient_value",)),
    "entropy_sign_flipped": Fault(BY_BUG["entropy_bonus_sign_flipped"].apply, ("loss_gradient_entropy",),
                                  settings={"entropy_coef": 0.01}),
    # zero_grad of the optimizer leaves the parameter's .grad to pile up as well (the same component).
    "parameter_left_out": Fault(lambda mp: None, ("optimizer_coverage",), also=("gradient_of_loss",),
                                prepare=parameter_left_out),
    # The reference Adam (optimizer_step_as_configured) sees the step undone too: the same component.
    "step_undone": Fault(step_undone, ("optimizer_coverage",), also=("optimizer_step_as_configured",)),
    # The first update's gradients start from zero: from the second on, the last step's are still there.
    "gradients_never_zeroed": Fault(BY_BUG["gradients_never_zeroed"].apply, ("gradient_of_loss",),
                                    also=("policy_starved",), from_update=1),
    "rewards_huge": Fault(rewards_huge, ("policy_starved",)),
    "minibatches_drawn_with_replacement": Fault(BY_BUG["minibatches_drawn_with_replacement"].apply,
                                                ("minibatch_coverage",)),
    "optimizer_state_reset_every_step": Fault(BY_BUG["optimizer_state_reset_every_step"].apply,
                                              ("optimizer_state_kept",), also=("optimizer_step_as_configured",)),
    "gradients_clipped_per_parameter": Fault(BY_BUG["gradients_clipped_per_parameter"].apply,
                                             ("gradient_clipped_as_configured",)),
    "gradients_clipped_by_value": Fault(BY_BUG["gradients_clipped_by_value_pendulum"].apply,
                                        ("gradient_clipped_as_configured",), env="Pendulum-v1", settings=PENDULUM),
    "residual_variance_swapped": Fault(residual_variance_swapped, ("telemetry_recomputed",)),
    "kl_of_the_wrong_distributions": Fault(BY_BUG["kl_compares_the_wrong_distributions"].apply,
                                           ("telemetry_recomputed",)),
}


@pytest.mark.parametrize("name", FAULTS)
def test_fault_breaks_exactly_its_invariant(name, monkeypatch):
    fault = FAULTS[name]
    fault.apply(monkeypatch)
    stats = run_updates(fault.env, updates=3, prefer=fault.prefer if fault.env == "CartPole-v1" else 0.0,
                        prepare=fault.prepare, **fault.settings)
    for key in (f"inv_{k}" for k in fault.breaks):
        values = measured(stats[fault.from_update:], key)
        assert len(values) >= 2 and all(v > LIMIT[key] for v in values), (key, values)
    assert_healthy(stats, skip={f"inv_{k}" for k in fault.breaks + fault.also})


def test_telemetry_disagreement_by_hand():
    """Equal values agree whatever the floor (all-zero advantages on a probe: 0 / 0 read as a disagreement of 1
    and raised telemetry_recomputed on a healthy Probe3 run); undefined on one side only is 1."""
    from rlvitals.learner.invariants.telemetry import _disagreement

    t = lambda *v: [torch.tensor(x, dtype=F64) for x in v]  # noqa: E731
    gaps = _disagreement(t(0.0, 1.0, math.nan, math.nan, 1.02), t(0.0, 1.0, 0.5, math.nan, 1.0),
                         t(0.0, 0.0, 0.01, 0.01, 0.01))
    assert gaps[:3].tolist() == [0.0, 0.0, 1.0] and math.isnan(gaps[3]) and gaps[4] == pytest.approx(0.02)


def test_clip_error_by_hand():
    """g = (3, 4), ||g|| = 5, max_grad_norm 1: the global clip gives (0.6, 0.8). Clipping each part on its own
    to norm 1 gives (1, 1): off by (0.4, 0.2), sqrt(0.2) of the expected norm 1. Below the bound nothing moves."""
    from rlvitals.learner.invariants.optimisation import clip_error

    g = torch.tensor([3.0, 4.0])
    assert clip_error(g, torch.tensor([0.6, 0.8]), 1.0) < 1e-6
    assert clip_error(g, torch.tensor([1.0, 1.0]), 1.0) == pytest.approx(math.sqrt(0.2), rel=1e-5)
    assert clip_error(g, g, 10.0) == 0.0 and clip_error(g, g, 1.0) > 1   # no clip where one was due
    assert clip_error(torch.zeros(2), torch.zeros(2), 1.0) == 0.0


def test_learning_rate_reference_by_hand():
    from rlvitals.learner.invariants import learning_rate_gap, scheduled_learning_rate

    assert scheduled_learning_rate(1e-3, False, 900, 1000) == 1e-3
    assert scheduled_learning_rate(1e-3, True, 250, 1000) == pytest.approx(7.5e-4)
    assert scheduled_learning_rate(1e-3, True, 2000, 1000) == 0.0
    assert learning_rate_gap([7.5e-4, 7.5e-4], 7.5e-4) == 0.0
    assert learning_rate_gap([1e-3], 7.5e-4) == pytest.approx(1 / 3)
    assert learning_rate_gap([1e-9], 0.0) == 1.0 and learning_rate_gap([0.0], 0.0) == 0.0
    assert math.isnan(learning_rate_gap([], 1e-3))


@pytest.mark.parametrize("bug", ["learning_rate_written_to_the_defaults", "learning_rate_decayed_per_update"])
def test_a_learning_rate_off_its_schedule_breaks_its_invariant_in_a_run(bug, tmp_path, monkeypatch):
    BY_BUG[bug].apply(monkeypatch)
    cfg = TrainConfig(env="CartPole-v1", progress=False, num_envs=8, rollout_length=128, device="cpu",
                      total_env_steps=8 * 128 * 4, run_dir=str(tmp_path / "run")).validate()
    telemetry = CapturingTelemetry("standard")
    train_in(cfg, ["test"], telemetry)
    values = [row["inv_learning_rate_as_configured"] for row in telemetry.stats
              if "inv_learning_rate_as_configured" in row]
    # every update after the first is off the schedule (the last, at the schedule's end, may meet it at 0)
    assert sum(v > LIMIT["inv_learning_rate_as_configured"] for v in values[1:]) >= 3, values
