"""PPO with V-trace importance correction (as in APPO), and the learner that runs it.

`ppo_loss` is the loss, a pure function of tensors; `PPOLearner.learn` is the
update loop around it: a batch arrives (targets from the network as it is
then), epochs x minibatches of steps, then the batch's statistics in one
host transfer.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
from torch import nn

from rlvitals.actors.rollout import Rollout

from . import diagnostics as diag
from .adam import make_adam
from .flat_gradients import FlatGradients
from .invariants import LearnerInvariants
from .minibatch_cost import MinibatchCost, cpu_seconds
from .normalize import LearnerNormalization
from .phases import PhaseLaps
from .returns import vtrace
from .sequences import Sequences, episode_starts
from .step_sums import HeadRuns, StepSums
from .transfer import first_nonfinite, head_positions, to_device, to_host, transferred


@dataclass
class PPOSettings:
    """The subset of the run config the learner needs (see rlvitals.config for docs)."""

    learning_rate: float
    gamma: float
    gae_lambda: float
    update_epochs: int
    num_minibatches: int
    clip_coef: float
    value_coef: float
    entropy_coef: float
    max_grad_norm: float
    normalize_advantages: bool
    vtrace_rho_clip: float
    vtrace_c_clip: float
    mixed_precision: bool = False
    normalize_rewards: bool = False
    normalize_clip: float = 10.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """Adam's moment decay rates (Kingma & Ba's defaults)."""
    adam_eps: float = 1e-5
    """Adam's epsilon: 1e-5 as in the PPO implementations of OpenAI baselines and CleanRL, not torch's 1e-8."""


def ppo_loss(logp, behaviour_logp, values, advantages, value_targets, entropy, s: PPOSettings):
    """Clipped surrogate + value regression - entropy bonus (Schulman et al., 2017, eq. 7 and 9).

    Per sample: log pi(a|x) now, log mu(a|x) of the actor, V(x) now, the advantage,
    the value target and the policy's entropy at x. Returns (loss, parts).
    """
    ratio = (logp - behaviour_logp).exp()          # pi / mu: corrects the step's own action
    if s.normalize_advantages and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - s.clip_coef, 1 + s.clip_coef) * advantages)
    policy_loss = -surrogate.mean()
    value_loss = 0.5 * (values - value_targets).pow(2).mean()
    entropy = entropy.mean()
    loss = policy_loss + s.value_coef * value_loss - s.entropy_coef * entropy
    clipped = ((ratio - 1).abs() > s.clip_coef).float().mean()
    return loss, {"policy_loss": policy_loss, "value_loss": value_loss, "entropy_loss": -entropy,
                  "clip_fraction": clipped}


@dataclass
class _Batch:
    """One rollout on the learner's device: the [T, N] tensors the targets need, and
    the valid samples flattened for the minibatch steps (`mb_*`, `count` of them)."""

    rewards: torch.Tensor
    valid: torch.Tensor
    values: torch.Tensor
    targets: torch.Tensor
    advantages: torch.Tensor
    mb_obs: torch.Tensor
    mb_actions: torch.Tensor
    mb_logp: torch.Tensor
    mb_params: torch.Tensor
    mb_adv: torch.Tensor
    mb_targets: torch.Tensor
    count: int
    stats: dict
    """0-d statistics of the batch as it arrived."""
    activations: diag.ActivationProbe
    sequences: Sequences | None = None
    """A recurrent policy's batch as per-env sequences (None: feed-forward)."""


@dataclass
class _Update:
    """What the minibatch steps of one batch leave for the statistics."""

    before: torch.Tensor
    steps: int
    stats: dict
    fwd_s: float
    """Seconds in forward and backward passes (the rest of the update: clipping, steps, running sums)."""
    cpu_s: float = 0.0
    """CPU seconds of the minibatch steps (minibatch_cost.cpu_seconds), judged per step against a reference."""


class PPOLearner:
    """Turns rollouts into optimizer steps; each optimizer step adds one to the network's age."""

    def __init__(self, net: nn.Module, settings: PPOSettings, device: torch.device, seed: int = 0,
                 value_trace: bool = False, debug: bool = False, hist_bounds=None):
        self.net = net.to(device)
        self.s = settings
        self.device = device
        self.optimizer = make_adam(net.parameters(), settings.learning_rate, settings.adam_betas, settings.adam_eps)
        self.generator = torch.Generator().manual_seed(int(seed) + 1)
        self.noise_scale = diag.GradientNoiseScale()
        self.value_trace = value_trace
        self.debug = debug
        self.hist_bounds = torch.tensor(hist_bounds or (0.0,), dtype=torch.float32, device=device)
        self.samples_learned = 0
        self.updates = 0
        self.nonfinite_batches = 0
        self.amp = settings.mixed_precision and device.type == "cuda"
        self.sync_phases = False
        """Wait for the device at each phase boundary: honest per-phase GPU times (profiling), slower updates."""
        self.heads = HeadRuns(head_positions(net, device), device)
        self.gradients = FlatGradients(self.net)
        self.reward_scale = torch.zeros((), device=device)
        self.initial_entropy: torch.Tensor | None = None
        """Mean entropy per action dimension on the run's first batch (entropy_change is measured from it)."""
        """Largest |reward| of any valid step learned from in this run (kept on the device)."""
        self.normalization = LearnerNormalization(net, settings.normalize_rewards, settings.normalize_clip, device)
        self.invariants = LearnerInvariants(self)
        self.minibatch_cost = MinibatchCost(settings)
        """The reference the minibatch phase is judged against (learner/minibatch_cost.py)."""

    def extra_state(self) -> dict:
        """What a checkpoint must keep of the learner beyond network, optimizer and counters (tensors only)."""
        ema = self.noise_scale
        return {"reward_scale": self.reward_scale.detach().cpu(), "normalization": self.normalization.state(),
                **({} if self.initial_entropy is None else {"initial_entropy": self.initial_entropy.detach().cpu()}),
                "noise_scale": [None if x is None else x.detach().cpu() for x in (ema.trace_ema, ema.sqnorm_ema)]}

    def load_extra_state(self, state: dict) -> None:
        if "reward_scale" in state:
            self.reward_scale = state["reward_scale"].to(self.device, torch.float32)
        self.normalization.load_state(state.get("normalization", {}))
        if "initial_entropy" in state:
            self.initial_entropy = state["initial_entropy"].to(self.device, torch.float32)
        if "noise_scale" in state:
            self.noise_scale.trace_ema, self.noise_scale.sqnorm_ema = (
                None if x is None else x.to(self.device) for x in state["noise_scale"])

    def set_learning_rate(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def learning_rates(self) -> list[float]:
        """The learning rate of each of the optimizer's parameter groups, as its steps read it."""
        return [float(group["lr"]) for group in self.optimizer.param_groups]

    def learn(self, rollout: Rollout) -> dict[str, float]:
        """One batch: V-trace targets at arrival, then epochs x minibatches of PPO steps."""
        staleness, age_before, scale_before = self.net.age - rollout.policy_age, self.net.age, self.reward_scale
        laps = PhaseLaps(self.device if self.sync_phases else None)
        tensors, index = self._transfer(rollout)
        laps.lap("transfer")
        self.invariants.received(rollout, tensors, index)
        self.invariants.stamp(rollout, staleness)
        self.invariants.before_scaling(tensors)
        self.normalization.scale_rewards(tensors)
        batch = self._arrive(tensors, index, staleness)
        laps.lap("targets")
        update = self._update(batch)
        laps.split_update(update.fwd_s)
        # After the update: this batch was learned with the observation statistics its actors acted with.
        batch.stats.update(self.normalization.update_observations(batch.mb_obs))
        out = self._report(batch, update)
        where = first_nonfinite(out)
        steps, count_learned = update.steps, batch.count
        if where:
            # Skip the batch: the weights, Adam's moments and the age are as if it never came.
            self._restore(update.before)
            self.net.age, self.reward_scale = age_before, scale_before
            self.normalization.undo()
            steps, count_learned = 0, 0
        self.samples_learned += count_learned * self.s.update_epochs
        self.updates += 1
        out.update({"staleness": float(staleness), "samples": float(count_learned), "learner_steps": float(steps),
                    "samples_learned": float(count_learned * self.s.update_epochs), "updates": 1.0,
                    "age": float(self.net.age), "nonfinite": float(bool(where)), "nonfinite_where": where,
                    "nonfinite_samples": float(batch.count - count_learned)})
        # A copy of the network steps on this batch's observations now and then: the minibatch phase's reference.
        self.minibatch_cost.measure(self.net, batch.mb_obs, self._autocast, batch.sequences)
        out.update(self.minibatch_cost.ratio(update.cpu_s, update.steps))
        laps.lap("statistics")
        out.update(laps.seconds)
        return out

    def _transfer(self, rollout: Rollout) -> tuple[dict, torch.Tensor]:
        """The rollout's tensors on the learner's device, and the flat positions of its valid samples."""
        index = rollout.valid.reshape(-1).nonzero().squeeze(-1)       # host-side: no device sync
        tensors = {k: to_device(getattr(rollout, k), self.device) for k in transferred(rollout)}
        return tensors, to_device(index, self.device)

    def _arrive(self, r: dict, index: torch.Tensor, staleness: int) -> _Batch:
        """Targets from the network as it is when the batch arrives (V-trace corrects staleness)."""
        s, net = self.s, self.net
        obs, actions, rewards, valid = r["obs"], r["actions"], r["rewards"], r["valid"]
        T, N = rewards.shape
        done = r["terminated"] | r["truncated"]
        with torch.no_grad():
            # Float32 even under mixed precision: the actors acted in float32, so on-policy ratios are 1 and
            # the consistency check stays exact (bfloat16 put 0.05 nats between learner and actor on an H100).
            sequences = None
            with diag.ActivationProbe(net, enabled=self.debug) as activations:
                if getattr(net, "recurrent_size", 0):   # each env's column replayed from its stored state
                    starts = episode_starts(r["initial_starts"], valid)
                    params_all, values_all, _ = net.replay(obs, starts, r["initial_state"])
                    sequences = Sequences(obs=obs[:T], starts=starts[:T], state=r["initial_state"], valid=valid)
                else:
                    params_all, values_all = net(obs.reshape(-1, *obs.shape[2:]))
            values_all, params_all = values_all.reshape(T + 1, N), params_all.reshape(T + 1, N, -1)
            params = params_all[:T]
            log_rhos = net.dist.log_prob(params, actions) - r["behaviour_logp"]
            values, next_values = values_all[:T], values_all[1:]
            targets, advantages = vtrace(values, next_values, rewards, r["terminated"], done, log_rhos,
                                         s.gamma, s.gae_lambda, s.vtrace_rho_clip, s.vtrace_c_clip, valid)
            stats = self._scale_stats(rewards, targets, valid, done)
            stats.update(self._batch_stats(params, values, targets, advantages, rewards, r["terminated"], valid,
                                           done, stats.pop("min_target_std")))
            stats.update(self._consistency(params_all, actions, r["behaviour_logp"], valid, staleness, log_rhos))
            stats["record_discrepancy"] = diag.record_discrepancy(self.net.dist, r["behaviour_params"], actions,
                                                                  r["behaviour_logp"], valid)
        flat = lambda x: x.reshape(T * N, *x.shape[2:]).index_select(0, index)  # noqa: E731
        batch = _Batch(rewards=rewards, valid=valid, values=values, targets=targets, advantages=advantages,
                       mb_obs=flat(obs[:T]), mb_actions=flat(actions), mb_logp=flat(r["behaviour_logp"]),
                       mb_params=flat(r["behaviour_params"]), mb_adv=flat(advantages), mb_targets=flat(targets),
                       count=int(index.shape[0]), stats=stats, activations=activations, sequences=sequences)
        with torch.no_grad():
            self.invariants.arrival(batch, r, params_all, values_all, index, log_rhos)
        return batch

    def _update(self, b: _Batch) -> _Update:
        """update_epochs shuffled passes over the batch, num_minibatches optimizer steps each."""
        s, net, dev = self.s, self.net, self.device
        before = diag.flat_params(net)
        sums = StepSums(dev, self.heads)
        fwd_s = 0.0
        steps = 0
        directions: dict = {}
        cpu_start = cpu_seconds()
        for epoch in range(s.update_epochs):
            for mb, cols in self._minibatches(b):
                ta = self._clock()
                # Loss directions are exact per sample: the update's first minibatch is enough to watch them.
                loss, parts, mb_params, mb_values = self._forward_backward(b, mb, directions if steps == 0 else None,
                                                                           cols=cols)
                self.invariants.step(mb, mb_params, mb_values, epoch == 0, epoch == s.update_epochs - 1)
                first_sampled = steps == 0 and self.invariants.sampled
                if epoch == 0:   # the gradient's statistics: first epoch
                    sums.gradients(self.gradients.flat())
                before_clip = self.gradients.flat().clone() if first_sampled else None
                tb = self._clock()
                grad_norm = nn.utils.clip_grad_norm_(net.parameters(), s.max_grad_norm)
                if first_sampled:
                    self.invariants.clipped(before_clip, self.gradients.flat())
                self.optimizer.step()
                if first_sampled:
                    self.invariants.stepped()
                net.age += 1
                steps += 1
                fwd_s += tb - ta
                sums.add(loss, parts, grad_norm)
                if epoch == s.update_epochs - 1:   # each sample once, with the policy learning it
                    sums.kl_step(mb, mb_params)
        cpu_s = cpu_seconds() - cpu_start
        stats = {**sums.result(steps, b.count, self.noise_scale, net.dist, b.mb_params), **directions}
        return _Update(before=before, steps=steps, stats=stats, fwd_s=fwd_s, cpu_s=cpu_s)

    def _minibatches(self, b: _Batch) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """One epoch's minibatches: (flat positions of their samples, env columns or None). Shuffled samples for
        a feed-forward policy; for a recurrent one, shuffled envs, each with its whole sequence."""
        if b.sequences is not None:
            return b.sequences.minibatches(self.s.num_minibatches, self.generator)
        order = torch.randperm(b.count, generator=self.generator).to(self.device, non_blocking=True)
        return [(mb, None) for mb in order.chunk(self.s.num_minibatches)]

    def _clock(self) -> float:
        """perf_counter(), after the device's queued work when phases are synchronised (sync_phases)."""
        if self.sync_phases and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _forward_backward(self, b: _Batch, mb: torch.Tensor, directions: dict | None = None,
                          cols: torch.Tensor | None = None):
        """The loss of one minibatch under the network as it is now, and its gradients (not yet clipped): (loss,
        its terms, the policy's parameters, the values).

        `cols`: a recurrent policy's env columns, replayed whole. `directions`, when given, receives which way
        the loss moves each output (diagnostics.loss_directions).
        """
        net = self.net
        with self._autocast():
            params, values = net(b.mb_obs[mb]) if cols is None else b.sequences.outputs(net, cols)
            logp = net.dist.log_prob(params, b.mb_actions[mb])
            entropy = net.dist.entropy(params)
            for output in (logp, values, entropy) if directions is not None else ():
                if output.requires_grad:   # their gradients show which way the loss pulls them
                    output.retain_grad()
            loss, parts = ppo_loss(logp, b.mb_logp[mb], values, b.mb_adv[mb], b.mb_targets[mb], entropy, self.s)
        self.optimizer.zero_grad(set_to_none=False)
        if directions is not None:
            self.invariants.before_backward()
        loss.backward(retain_graph=directions is not None and self.invariants.keeps_graph)
        if directions is not None:
            directions.update(diag.loss_directions(logp, values, entropy, b.mb_adv[mb], b.mb_targets[mb],
                                                   self.s.normalize_advantages, net.value_bias()))
            self.invariants.first_minibatch(parts["policy_loss"], params, logp, values, entropy, b, mb)
        return loss, parts, params, values

    def _report(self, b: _Batch, u: _Update) -> dict:
        """Every statistic of the batch, copied to the host in one transfer."""
        after = diag.flat_params(self.net)
        stats = {**b.stats, **u.stats, **diag.step_statistics(u.before, after),
                 "params_finite": torch.isfinite(after).all().float()}
        stats.update(self.invariants.report(b, u, after, stats))
        vectors = {}
        if self.value_trace:
            vectors.update(value_trace=b.values[:, 0], reward_trace=b.rewards[:, 0])
        if self.debug:
            vectors.update(target_hist=diag.bucket_counts(b.targets, b.valid, self.hist_bounds),
                           advantage_hist=diag.bucket_counts(b.advantages, b.valid, self.hist_bounds))
            stats.update({"target_hist_sum": (b.targets * b.valid).sum(),
                          "advantage_hist_sum": (b.advantages * b.valid).sum()})
            stats.update(diag.layer_statistics(self.net, b.activations))
            if b.sequences is not None:
                with torch.no_grad():
                    stats.update(diag.recurrent_statistics(self.net, b.sequences))
        return to_host(stats, vectors)

    def _autocast(self):
        """bfloat16 autocast for forward passes when mixed precision is on (CUDA only); else nothing."""
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.amp else contextlib.nullcontext()

    def _batch_stats(self, params, values, targets, advantages, rewards, terminated, valid, done, min_target_std):
        v = valid
        entropy = (self.net.dist.entropy(params) * v).sum() / v.sum().clamp_min(1)
        dist = self.net.dist
        per_dimension = entropy / dist.dims
        if self.initial_entropy is None:   # the run's first batch: the initial policy's spread
            self.initial_entropy = per_dimension.detach().clone()
        stats = {"relative_entropy": entropy / dist.max_entropy,
                 "entropy_change": per_dimension - self.initial_entropy,
                 "entropy_bounded": torch.full((), float(dist.entropy_bounded), device=self.device),
                 "residual_variance": diag.residual_variance(targets, values, v, min_target_std)}
        stats["terminal_correlation"], stats["penultimate_terminal_correlation"] = \
            diag.terminal_correlations(values, rewards, terminated, valid, done)
        stats.update(diag.summaries({"value": values, "target": targets, "advantage": advantages,
                                     "reward": rewards}, v))
        return stats

    def _scale_stats(self, rewards, targets, valid, done) -> dict:
        """The run's reward scale r_max, and the targets against the bound |v| <= r_max / (1 - gamma).

        Also the spread below which targets count as flat for residual_variance: 1% of
        r_max times the horizon, min(1 / (1 - gamma), the batch's mean episode length).
        Targets that differ by less (a plateau of truncated episodes, where every target is
        r_max / (1 - gamma)) make the ratio measure the value net's noise. The episode
        length caps the horizon so short episodes, whose values never reach
        r_max / (1 - gamma), keep a defined ratio.
        """
        batch_max = torch.where(valid, rewards.abs(), 0.0).amax()
        self.reward_scale = torch.fmax(self.reward_scale, batch_max.float())   # fmax: a NaN reward does not stick
        scale, nan = self.reward_scale, torch.full((), diag.NAN, device=self.device)
        episodes = (done & valid).sum()
        horizon = torch.where(episodes > 0, valid.sum() / episodes.clamp_min(1), torch.inf)
        if self.s.gamma < 1:
            horizon = horizon.clamp(max=1 / (1 - self.s.gamma))
        min_std = torch.where(torch.isinf(horizon), 0.0, 0.01 * scale * horizon)   # gamma = 1, no episode end: none
        if self.s.gamma >= 1:   # no bound on |v|
            return {"reward_scale": scale, "value_target_scale": nan, "min_target_std": min_std}
        bound = scale / (1 - self.s.gamma)
        target_max = torch.where(valid, targets.abs(), 0.0).amax()
        return {"reward_scale": scale, "min_target_std": min_std,
                "value_target_scale": torch.where(scale > 0, target_max / bound.clamp_min(1e-30), nan)}

    def _consistency(self, params_all, actions, behaviour_logp, valid, staleness: int, log_rhos) -> dict:
        """logp_discrepancy(_shifted), measured only when the batch was collected with the learner's own weights."""
        if staleness != 0:
            nan = torch.full((), diag.NAN, device=self.device)
            return {"logp_discrepancy": nan, "logp_discrepancy_shifted": nan}
        plain, shifted = diag.logp_discrepancy(self.net.dist, params_all, actions, behaviour_logp, valid, log_rhos)
        return {"logp_discrepancy": plain, "logp_discrepancy_shifted": shifted}

    def _restore(self, flat: torch.Tensor) -> None:
        """Put the weights from before the update back, and restart Adam's moments (they saw the NaN)."""
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(flat, self.net.parameters())
        self.optimizer.state.clear()
        self.nonfinite_batches += 1


