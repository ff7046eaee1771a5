"""Classic RL bugs, planted from outside the product code, and the component a diagnosis must name.

Each bug is applied with a `pytest.MonkeyPatch` (so the product code stays
correct) around the seams a real bug would sit at: what a rollout holds when
it leaves the actor, the returns the learner computes, the loss, the network's
heads, the optimizer, weight publishing. `tests/test_diagnosis.py` runs a
representative subset; `bench/diagnosis.py` runs every bug and tabulates which
channel caught it, the component named and the seconds to the first verdict.

Channels: `run` = the health rules evaluated live on a run's rows (the
invariants and the fast rules); `doctor` = the probe ladder (`rlvitals
doctor`), for bugs a healthy-looking CartPole curve hides.

This is the one library of planted bugs: the run-channel tests
(tests/test_diagnosis.py), the doctor's tests (tests/test_doctor.py), the
invariants' tests and the bench (bench/diagnosis.py) all take their bugs from
here. `LAST_ROUND` are the bugs the rules were first built from; `INVARIANT_BUGS`
were designed afterwards from the complement of each invariant
(telemetry/invariants.py): each breaks one property a correct run keeps.

A bug with `in_actors` must also run inside Ray's actor processes, which a
monkeypatch in this process does not reach: `plant_in_ray_workers` starts Ray
with a worker set-up hook (`plant_from_env`) that applies it there as well (and
a simulated slowdown, tests/throttle.py, likewise).
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable

import pytest
import torch
from planted_bug import PlantedBug
from planted_ray_stages import loop_waits_for_every_rollout_in_flight as learner_waits_for_every_request


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


def _vtrace_with(mp: pytest.MonkeyPatch, **replace: Callable[[dict], object]) -> None:
    """The learner's V-trace call with some arguments replaced: name -> f(all arguments by name)."""
    import inspect

    from rlvitals.learner import ppo

    signature = inspect.signature(ppo.vtrace)

    def change(*args):
        named = dict(zip(signature.parameters, args, strict=True))
        return tuple(replace[k](named) if k in replace else v for k, v in named.items())

    _wrap_vtrace(mp, change)


def _wrap_loss(mp: pytest.MonkeyPatch, change: Callable) -> None:
    from rlvitals.learner import ppo

    original = ppo.ppo_loss

    def ppo_loss(logp, behaviour_logp, values, advantages, value_targets, entropy, s):
        return original(*change(logp, behaviour_logp, values, advantages, value_targets, entropy, s))

    mp.setattr(ppo, "ppo_loss", ppo_loss)


def _after_loss(mp: pytest.MonkeyPatch, change: Callable) -> None:
    """The loss as computed, changed on its way out: change(loss, parts, s, args) -> (loss, parts)."""
    from rlvitals.learner import ppo

    original = ppo.ppo_loss

    def ppo_loss(*args):
        loss, parts = original(*args)
        return change(loss, parts, args[-1], args)

    mp.setattr(ppo, "ppo_loss", ppo_loss)


# ---------------------------------------------------------------- the bugs


def truncation_stored_as_termination(mp):
    def change(r):
        r.terminated = r.terminated | r.truncated

    _after_collect(mp, change)


def advantage_carry_not_reset(mp):
    # The naive loop: nothing cuts the recursion at an episode's end or at the reset transition.
    _vtrace_with(mp, done=lambda a: torch.zeros_like(a["done"]), valid=lambda a: torch.ones_like(a["valid"]))


def _rewards_late(r):
    r.rewards = torch.roll(r.rewards, 1, dims=0)


def rewards_one_step_late(mp):
    _after_collect(mp, _rewards_late)


def one_actor_stores_rewards_late(mp):
    """As rewards_one_step_late, in the one actor process that claims the bug (`claim_for_this_process`)."""
    mine: list[bool] = []

    def change(r):
        if not mine:
            mine.append(claim_for_this_process())
        if mine[0]:
            _rewards_late(r)

    _after_collect(mp, change)


def one_actor_loads_every_fourth_weights(mp):
    """One actor process (the one that claims the bug) loads the weights handed to it on every fourth request
    only, as a throttled refresh would, and stamps its rollouts honestly with the age it acts with."""
    from rlvitals.distributed.workers import RolloutWorker

    original = RolloutWorker.collect
    state: dict = {}

    def collect(self, weights, weights_age):
        if "mine" not in state:
            state["mine"], state["requests"] = claim_for_this_process(), 0
        if state["mine"]:
            state["requests"] += 1
            if state["requests"] % 4 != 1:
                weights = None      # keeps the network it has (the first request always loads)
        return original(self, weights, weights_age)

    mp.setattr(RolloutWorker, "collect", collect)


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
    # + c*L_V became - c*L_V
    _after_loss(mp, lambda loss, parts, s, args: (loss - 2 * s.value_coef * parts["value_loss"], parts))


def advantages_normalised_wrong_shape(mp):
    # [B] advantages turned into a [B, 1] column: the surrogate broadcasts to [B, B] and averages them away.
    _wrap_loss(mp, lambda logp, blogp, v, adv, tgt, ent, s: (logp, blogp, v, adv.unsqueeze(-1), tgt, ent, s))


def discount_ignored(mp):
    _vtrace_with(mp, gamma=lambda a: 1.0)


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


# ---------------------------------------------------------------- the doctor's variants (same idea, other seam)


def learning_rate_100x_in_the_step(mp):
    """The optimizer steps 100 times too far while the config says otherwise (a unit slip in a scheduler)."""
    class Adam(torch.optim.Adam):
        def step(self, closure=None):
            for group in self.param_groups:
                group["lr"] *= 100
            try:
                return super().step(closure)
            finally:
                for group in self.param_groups:
                    group["lr"] /= 100

    mp.setattr(torch.optim, "Adam", Adam)


def preprocessing_in_the_learner_only(mp):
    import dataclasses

    from rlvitals.learner.ppo import PPOLearner

    original = PPOLearner.learn

    def learn(self, rollout):                       # the classic: /255 applied where the actor never did
        return original(self, dataclasses.replace(rollout, obs=rollout.obs / 255.0))

    mp.setattr(PPOLearner, "learn", learn)


def truncation_as_termination_in_returns(mp):
    _vtrace_with(mp, terminated=lambda a: a["done"])


def entropy_of_the_distribution_negated(mp):
    from rlvitals.learner.networks import Categorical

    original = Categorical.entropy
    mp.setattr(Categorical, "entropy", lambda self, params: -original(self, params))


# ---------------------------------------------------------------- designed from the invariants' complements
# sampling: the actor's draws are not from the distribution it records


def _sampler(mp, cls_name: str, draw: Callable) -> None:
    from rlvitals.learner import networks

    cls = getattr(networks, cls_name)

    def sample(self, params, generator):
        actions = draw(self, params, generator)
        return actions, self.log_prob(params, actions)

    mp.setattr(cls, "sample", sample)


def actor_acts_greedily(mp):
    _sampler(mp, "Categorical", lambda self, params, g: params.argmax(-1))


def actor_prefers_the_first_action(mp):
    def draw(self, params, g):
        actions = torch.multinomial(torch.softmax(params, -1), 1, generator=g).squeeze(-1)
        coin = torch.rand(actions.shape, generator=g) < 0.25
        return torch.where(coin, torch.zeros_like(actions), actions)

    _sampler(mp, "Categorical", draw)


def actor_noise_twice_the_policy_std(mp):
    def draw(self, params, g):
        mean, log_std = self._split(params)
        return mean + 2 * log_std.exp() * torch.randn(mean.shape, generator=g, dtype=mean.dtype)

    _sampler(mp, "DiagGaussian", draw)


def actor_stores_clipped_actions(mp):
    # The env gets the clipped action either way; storing the clipped one breaks its recorded log-probability.
    def change(r):
        r.actions = r.actions.clamp(-0.5, 0.5)

    _after_collect(mp, change)


# boundary: what the learner gets is not what the env emitted


def reset_steps_marked_valid(mp):
    def change(r):
        r.valid = torch.ones_like(r.valid)
        r.valid_count = int(r.valid.sum())

    _after_collect(mp, change)


def rewards_clipped_by_the_actor(mp):
    def change(r):
        r.rewards = r.rewards.clamp(-1.0, 1.0)      # Pendulum's rewards reach -16: most are changed

    _after_collect(mp, change)


def last_step_of_each_rollout_lost(mp):
    def change(r):
        for name in ("actions", "rewards", "terminated", "truncated", "valid", "behaviour_params", "behaviour_logp"):
            setattr(r, name, getattr(r, name)[:-1])
        r.obs = r.obs[:-1]
        if r.discounted_returns is not None:
            r.discounted_returns = r.discounted_returns[:-1]
        r.valid_count = int(r.valid.sum())

    _after_collect(mp, change)


def env_observations_outside_their_space(mp):
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv, CartPoleVectorEnv

    shift = torch.tensor([10.0, 0.0, 0.0, 0.0]).numpy()   # the cart's position, far past its +-4.8 bound
    for cls in (CartPoleEnv, CartPoleVectorEnv):           # one env, and gymnasium's own vector version
        step, reset = cls.step, cls.reset

        def shifted_step(self, action, _step=step):
            obs, *rest = _step(self, action)
            return (obs + shift).astype(obs.dtype), *rest

        def shifted_reset(self, *args, _reset=reset, **kwargs):
            obs, info = _reset(self, *args, **kwargs)
            return (obs + shift).astype(obs.dtype), info

        mp.setattr(cls, "step", shifted_step)
        mp.setattr(cls, "reset", shifted_reset)


# dataflow: the loss's inputs or gradients are not the batch's


def lambda_used_as_gamma(mp):
    _vtrace_with(mp, gamma=lambda a: a["lam"])


def bootstrap_from_the_current_state(mp):
    _vtrace_with(mp, next_values=lambda a: a["values"])


def policy_trained_on_value_targets(mp):
    _wrap_loss(mp, lambda logp, blogp, v, adv, tgt, ent, s: (logp, blogp, v, tgt, tgt, ent, s))


def value_coefficient_applied_twice(mp):
    _after_loss(mp, lambda loss, parts, s, args:
                (loss + (s.value_coef * s.value_coef - s.value_coef) * parts["value_loss"], parts))


# optimisation: a parameter with a gradient that the optimizer does not step


def value_head_left_out_of_the_optimizer(mp):
    from rlvitals.learner.ppo import PPOLearner

    original = PPOLearner.__init__

    def init(self, net, settings, *args, **kwargs):
        original(self, net, settings, *args, **kwargs)
        value = {id(p) for p in net.heads()["value"]}
        self.optimizer = torch.optim.Adam([p for p in net.parameters() if id(p) not in value],
                                          lr=settings.learning_rate, eps=1e-5)

    mp.setattr(PPOLearner, "__init__", init)


def gradients_zeroed_by_the_clip(mp):
    original = torch.nn.utils.clip_grad_norm_

    def clip_grad_norm_(parameters, max_norm, *args, **kwargs):
        parameters = list(parameters)
        norm = original(parameters, max_norm, *args, **kwargs)
        for p in parameters:
            if p.grad is not None:
                p.grad.zero_()                           # "clipped" to nothing: the step moves nothing
        return norm

    mp.setattr(torch.nn.utils, "clip_grad_norm_", clip_grad_norm_)


# telemetry: a diagnostic that is itself wrong


def residual_variance_arguments_swapped(mp):
    from rlvitals.learner import diagnostics

    original = diagnostics.residual_variance
    mp.setattr(diagnostics, "residual_variance",
               lambda targets, values, mask, min_std=0.0: original(values, targets, mask, min_std))


def clip_fraction_reported_inverted(mp):
    _after_loss(mp, lambda loss, parts, s, args: (loss, {**parts, "clip_fraction": 1 - parts["clip_fraction"]}))


# pipeline: memory, weights, accounting


GRAPHS: list = []


def learner_keeps_every_loss_graph(mp):
    GRAPHS.clear()

    def keep(loss, parts, s, args):
        GRAPHS.append((loss, args))                # the loss with its graph, and the minibatch it came from
        return loss, parts

    _after_loss(mp, keep)


def actor_caches_every_weights_version(mp):
    from rlvitals.distributed.workers import RolloutWorker

    original = RolloutWorker.collect

    def collect(self, weights, weights_age):
        # A cache of loaded weights keyed by network age that nothing evicts (kept in float64 "for replay").
        if weights and weights_age != self.weights_age:
            import ray
            cache = self.__dict__.setdefault("_planted_cache", {})
            cache[weights_age] = {k: v.double().clone() for k, v in ray.get(weights[0]).items()}
        return original(self, weights, weights_age)

    mp.setattr(RolloutWorker, "collect", collect)


def vector_envs_share_one_seed(mp):
    from rlvitals.actors.witness import Witness

    original = Witness.reset

    def reset(self, **kwargs):
        if isinstance(kwargs.get("seed"), int):      # one seed per sub-env, meant as "seed everything with it"
            kwargs["seed"] = [kwargs["seed"]] * self.n
        return original(self, **kwargs)

    mp.setattr(Witness, "reset", reset)


def actors_share_one_seed(mp):
    from rlvitals.distributed import workers

    env_seed, seed_for_actor = workers.env_seed, workers.seed_for_actor
    # Every actor seeded from the run's seed alone (the actor id left out of both seeds).
    mp.setattr(workers, "env_seed", lambda seed, actor_id: env_seed(seed, 0))
    mp.setattr(workers, "seed_for_actor", lambda seed, actor_id: seed_for_actor(seed, 0))


def episode_lengths_count_the_reset_step(mp):
    def change(r):
        r.episodes.lengths = r.episodes.lengths + 1      # the NEXT_STEP reset transition counted as a step

    _after_collect(mp, change)


def episode_returns_of_scaled_rewards(mp):
    def change(r):
        r.episodes.returns = r.episodes.returns * 0.1    # summed after a reward scale meant for the learner only

    _after_collect(mp, change)


def minibatches_drawn_with_replacement(mp):
    def randperm(n, generator=None, **kwargs):
        # The textbook slip: random indices where a permutation belongs (some samples twice, some never).
        return torch.randint(int(n), (int(n),), generator=generator, **kwargs)

    mp.setattr(torch, "randperm", randperm)     # the learner's only caller (learner/ppo.py)


def gradients_clipped_per_parameter(mp):
    def clip_grad_norm_(parameters, max_norm, *args, **kwargs):
        # Each parameter's gradient clipped to max_norm on its own: the global norm may stay far above it, and
        # the step's direction changes wherever some parameters are clipped and others are not.
        grads = [p.grad for p in parameters if p.grad is not None]
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        for g in grads:
            g.mul_((max_norm / (torch.linalg.vector_norm(g) + 1e-6)).clamp(max=1.0))
        return total

    mp.setattr(torch.nn.utils, "clip_grad_norm_", clip_grad_norm_)


def gradients_clipped_by_value(mp):
    def clip_grad_norm_(parameters, max_norm, *args, **kwargs):
        # The other clip of torch.nn.utils: every element clamped to +-max_norm, the norm left as it comes.
        parameters = list(parameters)
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in parameters
                                                      if p.grad is not None]))
        torch.nn.utils.clip_grad_value_(parameters, max_norm)
        return total

    mp.setattr(torch.nn.utils, "clip_grad_norm_", clip_grad_norm_)


def actor_acts_on_the_previous_observation(mp):
    from rlvitals.actors.runner import EnvRunner

    original = EnvRunner._act

    def _act(self, policy, obs):
        # The policy is called on an input buffer that is refreshed after the call: it sees the last step's.
        previous = self.__dict__.get("_planted_previous", obs)
        self._planted_previous = obs.copy()
        return original(self, policy, previous)

    mp.setattr(EnvRunner, "_act", _act)


def learning_rate_decayed_per_update(mp):
    from rlvitals.learner.ppo import PPOLearner

    original = PPOLearner.set_learning_rate

    def set_learning_rate(self, lr):
        # The linear decay counted in updates against a total counted in env steps: the rate is gone at once.
        updates = self.__dict__.setdefault("_planted_updates", 0) + 1
        self._planted_updates = updates
        original(self, lr * max(0.0, 1.0 - 16 * updates / 1000))

    mp.setattr(PPOLearner, "set_learning_rate", set_learning_rate)


def learning_rate_written_to_the_defaults(mp):
    from rlvitals.learner.ppo import PPOLearner

    def set_learning_rate(self, lr):
        self.optimizer.defaults["lr"] = lr      # read only when a group is added: the steps keep the first rate

    mp.setattr(PPOLearner, "set_learning_rate", set_learning_rate)


def weights_one_age_behind(mp):
    from rlvitals.distributed.fleet import Fleet

    original = Fleet.publish

    def publish(self, net):
        # The parameters of the previous publication go out stamped with the new age (a buffer swapped late).
        state = {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}
        previous = getattr(self, "_planted_previous", state)
        self._planted_previous = state
        sent = {**state, **{k: previous[k] for k, _ in net.named_parameters()}}
        refs, age = original(self, net)
        return [self.ray.put(sent)], age

    mp.setattr(Fleet, "publish", publish)


# ---------------------------------------------------------------- planting inside Ray's actor processes
PLANT_ENV = "RLVITALS_PLANTED_BUG"


CLAIM_ENV = "RLVITALS_PLANTED_CLAIM"
claim_path: str | None = None
"""Where the actor process that claimed a one-actor bug wrote its pid (the last plant_in_ray_workers's)."""


def claim_for_this_process() -> bool:
    """True in the first process to ask (it writes its pid to the claim file named in the environment)."""
    path = os.environ.get(CLAIM_ENV)
    if not path:
        return False
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    return True


def plant_from_env() -> None:
    """Ray worker set-up hook: apply the bug named in the environment, and the slowdown, for this worker's life."""
    from throttle import slow_from_env

    name = os.environ.get(PLANT_ENV)
    if name:
        BY_BUG[name].apply(pytest.MonkeyPatch())
    slow_from_env()


def plant_in_ray_workers(bug: PlantedBug | None, slowdown: float = 1.0) -> bool:
    """Start a private Ray whose workers run `bug` (if it lives in the actors) and `slowdown` too.

    True: started here, the caller shuts it down. False: neither needs Ray's workers (the run starts its own).
    """
    from throttle import SLOWDOWN_ENV

    global claim_path
    env_vars = {}
    if bug is not None and bug.in_actors:
        env_vars[PLANT_ENV] = bug.name
        if bug.one_actor:
            claim_path = env_vars[CLAIM_ENV] = os.path.join(tempfile.mkdtemp(prefix="rlvitals-claim-"), "pid")
    if slowdown != 1.0:
        env_vars[SLOWDOWN_ENV] = str(slowdown)
    if not env_vars:
        return False
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")   # loopback only, as rlvitals starts it
    import ray

    here = os.path.dirname(os.path.abspath(__file__))
    env_vars["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, configure_logging=False,
             runtime_env={"worker_process_setup_hook": "planted_bugs.plant_from_env", "env_vars": env_vars})
    return True


BUGS: tuple[PlantedBug, ...] = (
    PlantedBug("truncation_as_termination", "returns", "doctor", truncation_as_termination_in_returns,
               what="the returns treat time-limit truncation as termination: no bootstrap at the limit"),
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

LAST_ROUND = BUGS

RAY = {"mode": "ray", "num_actors": 2, "torch_threads": 1}
PENDULUM = "Pendulum-v1"

INVARIANT_BUGS: tuple[PlantedBug, ...] = (
    PlantedBug("actor_acts_greedily", "actor", "run", actor_acts_greedily, invariant="sampling_logp",
               what="the actor acts by argmax and records the policy's log-probability of it"),
    PlantedBug("actor_prefers_the_first_action", "actor", "run", actor_prefers_the_first_action,
               invariant="sampling_frequency", what="a quarter of the draws replaced by action 0"),
    PlantedBug("actor_noise_twice_the_policy_std", "actor", "run", actor_noise_twice_the_policy_std,
               env=PENDULUM, invariant="sampling_logp",
               what="continuous actions drawn with twice the recorded standard deviation"),
    PlantedBug("actor_stores_clipped_actions", "actor", "run", actor_stores_clipped_actions, env=PENDULUM,
               invariant="behaviour_record", what="the stored action is clipped, its log-probability is not"),
    PlantedBug("reset_steps_marked_valid", "actor", "run", reset_steps_marked_valid, invariant="boundary_resets",
               what="NEXT_STEP reset transitions stored as valid steps"),
    PlantedBug("rewards_clipped_by_the_actor", "actor", "run", rewards_clipped_by_the_actor, env=PENDULUM,
               invariant="boundary_rewards", what="rewards clipped to [-1, 1] before storing"),
    PlantedBug("last_step_of_each_rollout_lost", "actor", "run", last_step_of_each_rollout_lost,
               invariant="boundary_step_count", what="each rollout loses its last step"),
    PlantedBug("truncation_stored_as_termination", "actor", "run", truncation_stored_as_termination,
               invariant="boundary_episode_ends",
               what="the actor stores time-limit truncations as terminations"),
    PlantedBug("env_observations_outside_their_space", "env", "run", env_observations_outside_their_space,
               invariant="observation_space", what="the env's cart position shifted outside its declared bounds"),
    PlantedBug("lambda_used_as_gamma", "returns", "run", lambda_used_as_gamma, invariant="returns_recomputed",
               what="GAE's lambda passed where gamma belongs"),
    PlantedBug("bootstrap_from_the_current_state", "returns", "run", bootstrap_from_the_current_state,
               invariant="returns_recomputed", what="targets bootstrap from V(s_t) instead of V(s_t+1)"),
    PlantedBug("policy_trained_on_value_targets", "policy", "run", policy_trained_on_value_targets,
               invariant="loss_gradient_policy", what="the surrogate is given value targets for advantages"),
    PlantedBug("value_coefficient_applied_twice", "value", "run", value_coefficient_applied_twice,
               invariant="loss_gradient_value", what="the value loss weighted by c_v squared"),
    PlantedBug("value_head_left_out_of_the_optimizer", "optimizer", "run", value_head_left_out_of_the_optimizer,
               invariant="optimizer_coverage", what="the optimizer is built without the value head's parameters"),
    PlantedBug("gradients_zeroed_by_the_clip", "optimizer", "run", gradients_zeroed_by_the_clip,
               invariant="optimizer_coverage", what="gradient clipping zeroes the gradients it should scale"),
    PlantedBug("residual_variance_arguments_swapped", "telemetry", "run", residual_variance_arguments_swapped,
               invariant="telemetry_recomputed", what="residual variance computed as Var(v - t) / Var(v)"),
    PlantedBug("clip_fraction_reported_inverted", "telemetry", "run", clip_fraction_reported_inverted,
               invariant="telemetry_recomputed", what="the clip fraction exported as 1 - the clip fraction"),
    PlantedBug("vector_envs_share_one_seed", "actor", "run", vector_envs_share_one_seed, env="Acrobot-v1",
               invariant="streams_independent", what="every sub-env of the vector env reset with the same seed "
                                                     "(CartPole's native vector env draws all from one generator)"),
    PlantedBug("vector_envs_share_one_seed_pendulum", "actor", "run", vector_envs_share_one_seed, env=PENDULUM,
               invariant="streams_independent", what="as vector_envs_share_one_seed, on Pendulum"),
    PlantedBug("episode_lengths_count_the_reset_step", "telemetry", "run", episode_lengths_count_the_reset_step,
               invariant="episode_statistics", what="reported episode lengths count the reset transition"),
    PlantedBug("episode_returns_of_scaled_rewards", "telemetry", "run", episode_returns_of_scaled_rewards,
               env=PENDULUM, invariant="episode_statistics",
               what="reported episode returns summed from rewards scaled by 0.1"),
    PlantedBug("minibatches_drawn_with_replacement", "optimizer", "run", minibatches_drawn_with_replacement,
               invariant="minibatch_coverage", what="each epoch's minibatch indices drawn with replacement"),
    PlantedBug("gradients_clipped_per_parameter", "optimizer", "run", gradients_clipped_per_parameter,
               invariant="gradient_clipped_as_configured",
               what="each parameter's gradient clipped to max_grad_norm on its own, not by the global norm"),
    PlantedBug("gradients_clipped_by_value_pendulum", "optimizer", "run", gradients_clipped_by_value, env=PENDULUM,
               invariant="gradient_clipped_as_configured",
               what="every gradient element clamped to +-max_grad_norm instead of clipping the global norm"),
    PlantedBug("actor_acts_on_the_previous_observation", "actor", "run", actor_acts_on_the_previous_observation,
               invariant="acted_on_stored_observation",
               what="the actor's policy is called on the previous step's observation"),
    PlantedBug("actor_acts_on_the_previous_observation_pendulum", "actor", "run",
               actor_acts_on_the_previous_observation, env=PENDULUM, invariant="acted_on_stored_observation",
               what="as actor_acts_on_the_previous_observation, on Pendulum"),
    PlantedBug("learning_rate_decayed_per_update", "optimizer", "run", learning_rate_decayed_per_update,
               invariant="learning_rate_as_configured",
               what="the learning rate's linear decay counted in updates: it reaches 0 within 63 updates"),
    PlantedBug("learning_rate_written_to_the_defaults", "optimizer", "run", learning_rate_written_to_the_defaults,
               invariant="learning_rate_as_configured",
               what="the annealed rate written to the optimizer's defaults, not its groups: it never decays"),
    PlantedBug("learner_keeps_every_loss_graph", "memory", "run", learner_keeps_every_loss_graph,
               invariant="memory_per_sample", what="every minibatch loss kept with its graph"),
    PlantedBug("value_coefficient_applied_twice_pendulum", "value", "run", value_coefficient_applied_twice,
               env=PENDULUM, invariant="loss_gradient_value", what="as value_coefficient_applied_twice, on Pendulum"),
    PlantedBug("ray_actor_acts_greedily", "actor", "run", actor_acts_greedily, overrides=RAY, mode="ray",
               in_actors=True, invariant="sampling_logp", what="Ray actors act by argmax"),
    PlantedBug("ray_reset_steps_marked_valid", "actor", "run", reset_steps_marked_valid, overrides=RAY, mode="ray",
               in_actors=True, invariant="boundary_resets", what="Ray actors store reset transitions as valid"),
    PlantedBug("ray_rewards_one_step_late", "actor", "run", rewards_one_step_late, overrides=RAY, mode="ray",
               in_actors=True, invariant="boundary_rewards", what="Ray actors store each reward a step late"),
    PlantedBug("ray_one_actor_of_four_stores_rewards_late", "actor", "run", one_actor_stores_rewards_late,
               overrides={**RAY, "num_actors": 4, "actor_cpus": 0.25}, mode="ray", in_actors=True, one_actor=True,
               invariant="boundary_rewards",
               what="one Ray actor of four (one process: its node, its version) stores each reward a step late"),
    PlantedBug("ray_one_actor_of_four_loads_every_fourth_weights", "weight-sync", "run",
               one_actor_loads_every_fourth_weights, overrides={**RAY, "num_actors": 4, "actor_cpus": 0.25},
               mode="ray", in_actors=True, one_actor=True, invariant="weights_current_at_request",
               what="one Ray actor of four loads the weights handed to it on every fourth request only, stamping "
                    "the age it acts with honestly"),
    PlantedBug("ray_weights_one_age_behind", "weight-sync", "run", weights_one_age_behind, overrides=RAY,
               mode="ray", invariant="weights_as_stamped",
               what="each publication carries the previous parameters under the new age"),
    PlantedBug("ray_actor_caches_every_weights_version", "memory", "run", actor_caches_every_weights_version,
               overrides={**RAY, "hidden_sizes": (512, 512), "rollout_length": 32}, mode="ray", in_actors=True,
               budget_scale=3.0,
               invariant="memory_per_sample",
               what="Ray actors keep a float64 copy of every weights version they load (a cache nothing evicts)"),
    PlantedBug("ray_actors_share_one_seed", "actor", "run", actors_share_one_seed, overrides=RAY, mode="ray",
               in_actors=True, invariant="streams_independent",
               what="every Ray actor seeds its envs and its sampler from the run's seed alone"),
    PlantedBug("ray_episode_lengths_count_the_reset_step", "telemetry", "run", episode_lengths_count_the_reset_step,
               overrides=RAY, mode="ray", in_actors=True, invariant="episode_statistics",
               what="Ray actors' reported episode lengths count the reset transition"),
    PlantedBug("ray_value_head_left_out_of_the_optimizer", "optimizer", "run", value_head_left_out_of_the_optimizer,
               overrides=RAY, mode="ray", invariant="optimizer_coverage",
               what="Ray mode: the learner's optimizer misses the value head"),
    PlantedBug("ray_learner_waits_for_every_request", "learner", "run", learner_waits_for_every_request,
               overrides=RAY, mode="ray", invariant="learner_waits_while_ready",
               what="Ray async mode: the learner waits for every request in flight before taking a ready batch"),
)

DOCTOR_BUGS: tuple[PlantedBug, ...] = (
    # Where the doctor's tests plant a bug at another seam than the run channel's bug of the same idea.
    PlantedBug("learning_rate_100x_in_the_step", "optimizer", "doctor", learning_rate_100x_in_the_step,
               what="the optimizer steps 100x the configured learning rate"),
    PlantedBug("preprocessing_in_the_learner_only", "preprocessing", "doctor", preprocessing_in_the_learner_only,
               what="observations divided by 255 in the learner only"),
    PlantedBug("entropy_of_the_distribution_negated", "policy", "doctor", entropy_of_the_distribution_negated,
               what="the distribution's entropy negated (the bonus becomes a penalty)"),
)

from planted_cost_bugs import COST_BUGS  # noqa: E402
from planted_env_stages import ENV_STAGE_BUGS  # noqa: E402  (they import the helpers above)
from planted_learner_stages import LEARNER_STAGE_BUGS  # noqa: E402
from planted_ray_stages import RAY_STAGE_BUGS  # noqa: E402
from planted_recurrent import RECURRENT_BUGS  # noqa: E402
from planted_settings import SETTINGS_BUGS  # noqa: E402
from planted_telemetry import STATISTICS_BUGS, TELEMETRY_BUGS  # noqa: E402

STAGE_BUGS = (LEARNER_STAGE_BUGS + ENV_STAGE_BUGS + RAY_STAGE_BUGS + RECURRENT_BUGS + TELEMETRY_BUGS + SETTINGS_BUGS
              + STATISTICS_BUGS)
"""Designed from the stages' complements (issue 31): each breaks one stage's output given its own inputs."""

BUGS = LAST_ROUND + INVARIANT_BUGS + DOCTOR_BUGS + STAGE_BUGS + COST_BUGS

BY_BUG = {b.name: b for b in BUGS}
