"""PPO with V-trace importance correction (as in APPO), and the learner that runs it.

The loss is `ppo_loss`; everything else here is the update loop around it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
from torch import nn

from rlvitals.actors.rollout import Rollout

from . import diagnostics as diag
from .returns import vtrace


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


def ppo_loss(net, obs, actions, behaviour_logp, advantages, value_targets, s: PPOSettings):
    """Clipped surrogate + value regression - entropy bonus (Schulman et al., 2017)."""
    params, values = net(obs)
    logp = net.dist.log_prob(params, actions)
    ratio = (logp - behaviour_logp).exp()          # pi / mu: corrects the step's own action
    if s.normalize_advantages and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - s.clip_coef, 1 + s.clip_coef) * advantages)
    policy_loss = -surrogate.mean()
    value_loss = 0.5 * (values - value_targets).pow(2).mean()
    entropy = net.dist.entropy(params).mean()
    loss = policy_loss + s.value_coef * value_loss - s.entropy_coef * entropy
    clipped = ((ratio - 1).abs() > s.clip_coef).float().mean()
    return loss, {"policy_loss": policy_loss, "value_loss": value_loss, "entropy_loss": -entropy,
                  "clip_fraction": clipped}, params


class PPOLearner:
    """Turns rollouts into optimizer steps; each optimizer step adds one to the network's age."""

    def __init__(self, net: nn.Module, settings: PPOSettings, device: torch.device, seed: int = 0,
                 value_trace: bool = False, debug: bool = False, hist_bounds=None):
        self.net = net.to(device)
        self.s = settings
        self.device = device
        self.optimizer = torch.optim.Adam(net.parameters(), lr=settings.learning_rate, eps=1e-5)
        self.generator = torch.Generator().manual_seed(int(seed) + 1)
        self.noise_scale = diag.GradientNoiseScale()
        self.value_trace = value_trace
        self.debug = debug
        self.hist_bounds = torch.tensor(hist_bounds or (0.0,), dtype=torch.float32, device=device)
        self.samples_learned = 0
        self.updates = 0
        self.nonfinite_batches = 0
        self.amp = settings.mixed_precision and device.type == "cuda"

    def set_learning_rate(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def learn(self, rollout: Rollout) -> dict[str, float]:
        """One batch: V-trace targets at arrival, then epochs x minibatches of PPO steps."""
        s, net, dev = self.s, self.net, self.device
        staleness = net.age - rollout.policy_age
        t0 = time.perf_counter()
        T, N = rollout.num_steps, rollout.num_envs
        valid_flat = rollout.valid.reshape(-1)
        index = valid_flat.nonzero().squeeze(-1)       # host-side: no device sync
        obs, actions, rewards, terminated, truncated, valid, behaviour_params, behaviour_logp, index = (
            _to_device(x, dev) for x in (rollout.obs, rollout.actions, rollout.rewards, rollout.terminated,
                                         rollout.truncated, rollout.valid, rollout.behaviour_params,
                                         rollout.behaviour_logp, index))
        done = terminated | truncated
        t1 = time.perf_counter()

        # Targets from the network as it is when the batch arrives (V-trace corrects staleness).
        with torch.no_grad():
            with diag.ActivationProbe(net, enabled=self.debug) as activations, self._autocast():
                params_all, values_all = net(obs.reshape(-1, *obs.shape[2:]))
            params_all, values_all = params_all.float(), values_all.float()  # no-ops without autocast
            values_all = values_all.reshape(T + 1, N)
            params = params_all.reshape(T + 1, N, -1)[:T]
            log_rhos = net.dist.log_prob(params, actions) - behaviour_logp
            values, next_values = values_all[:T], values_all[1:]
            targets, advantages = vtrace(values, next_values, rewards, terminated, done, log_rhos,
                                         s.gamma, s.gae_lambda, s.vtrace_rho_clip, s.vtrace_c_clip, valid)
            stats = self._batch_stats(params, values, targets, advantages, rewards, terminated, valid, done)

        flat = lambda x: x.reshape(T * N, *x.shape[2:]).index_select(0, index)  # noqa: E731
        mb_obs, mb_actions, mb_logp = flat(obs[:T]), flat(actions), flat(behaviour_logp)
        mb_adv, mb_targets, mb_bparams = flat(advantages), flat(targets), flat(behaviour_params)
        count = int(index.shape[0])
        before = diag.flat_params(net)
        age_before = net.age
        loss_ok = torch.ones((), dtype=torch.bool, device=dev)
        grads_ok = torch.ones((), dtype=torch.bool, device=dev)
        sums: dict[str, torch.Tensor] = {}
        grad_absmax = torch.zeros((), device=dev)
        kl_sum = torch.zeros((), device=dev)
        small_sq = torch.zeros((), device=dev)
        big_grad = None
        fwd_s = opt_s = 0.0
        steps = 0
        for epoch in range(s.update_epochs):
            order = torch.randperm(count, generator=self.generator).to(dev, non_blocking=True)
            for mb in order.chunk(s.num_minibatches):
                ta = time.perf_counter()
                with self._autocast():
                    loss, parts, mb_params = ppo_loss(net, mb_obs[mb], mb_actions[mb], mb_logp[mb],
                                                      mb_adv[mb], mb_targets[mb], s)
                self.optimizer.zero_grad(set_to_none=False)
                loss.backward()
                grads = diag.flat_grads(net)
                tb = time.perf_counter()
                grad_norm = nn.utils.clip_grad_norm_(net.parameters(), s.max_grad_norm)
                loss_ok &= torch.isfinite(loss.detach())   # flags stay on the device: no sync here
                grads_ok &= torch.isfinite(grad_norm)
                self.optimizer.step()
                net.age += 1
                steps += 1
                opt_s += time.perf_counter() - tb
                fwd_s += tb - ta
                for k, v in parts.items():
                    sums[k] = sums.get(k, 0.0) + v.detach()
                sums["grad_norm"] = sums.get("grad_norm", 0.0) + grad_norm.detach()
                sums["grad_meansq"] = sums.get("grad_meansq", 0.0) + grads.pow(2).mean()
                grad_absmax = torch.maximum(grad_absmax, grads.abs().max())
                if epoch == 0:
                    small_sq = small_sq + grads.pow(2).sum()
                    big_grad = grads.clone() if big_grad is None else big_grad + grads
                if epoch == s.update_epochs - 1:   # each sample once, with the policy learning it
                    kl_sum = kl_sum + net.dist.kl(mb_bparams[mb], mb_params.detach().float()).sum()
        n_first = max(1, min(s.num_minibatches, count))
        noise = self.noise_scale.update(small_sq / n_first, (big_grad / n_first).pow(2).sum(),
                                        count / n_first, float(count))
        after = diag.flat_params(net)
        stats.update({k: v / steps for k, v in sums.items()})
        stats.update(diag.step_statistics(before, after))
        stats.update({"grad_absmax": grad_absmax, "kl": kl_sum / max(count, 1), "grad_noise_scale": noise,
                      "params_finite": torch.isfinite(after).all().float(),
                      "loss_finite": loss_ok.float(), "grads_finite": grads_ok.float()})

        vectors = {}
        if self.value_trace:
            vectors.update(value_trace=values[:, 0], reward_trace=rewards[:, 0])
        if self.debug:
            vectors.update(target_hist=diag.bucket_counts(targets, valid, self.hist_bounds),
                           advantage_hist=diag.bucket_counts(advantages, valid, self.hist_bounds))
            stats.update({"target_hist_sum": (targets * valid).sum(), "advantage_hist_sum": (advantages * valid).sum()})
            stats.update(diag.layer_statistics(net, activations))
        out = _to_host(stats, vectors)
        where = _first_nonfinite(out)
        if where:
            # Skip the batch: the weights, Adam's moments and the age are as if it never came.
            self._restore(before)
            net.age = age_before
            steps, count_learned = 0, 0
        else:
            count_learned = count
        self.samples_learned += count_learned * s.update_epochs
        self.updates += 1
        out.update({"staleness": float(staleness), "samples": float(count_learned), "learner_steps": float(steps),
                    "samples_learned": float(count_learned * s.update_epochs), "updates": 1.0,
                    "age": float(net.age), "nonfinite": float(bool(where)), "nonfinite_where": where,
                    "nonfinite_samples": float(count - count_learned),
                    "time_transfer": t1 - t0, "time_forward_backward": fwd_s, "time_optimizer": opt_s})
        return out

    def _autocast(self):
        """bfloat16 autocast for forward passes when mixed precision is on (CUDA only); else nothing."""
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.amp else contextlib.nullcontext()

    def _batch_stats(self, params, values, targets, advantages, rewards, terminated, valid, done):
        v = valid
        entropy = (self.net.dist.entropy(params) * v).sum() / v.sum().clamp_min(1)
        stats = {"relative_entropy": entropy / self.net.dist.max_entropy,
                 "residual_variance": diag.residual_variance(targets, values, v)}
        stats["terminal_correlation"], stats["penultimate_terminal_correlation"] = \
            diag.terminal_correlations(values, rewards, terminated, valid, done)
        for name, x in (("value", values), ("target", targets), ("advantage", advantages), ("reward", rewards)):
            stats.update(diag.summary(name, x, v))
        return stats

    def _restore(self, flat: torch.Tensor) -> None:
        """Put the weights from before the update back, and restart Adam's moments (they saw the NaN)."""
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(flat, self.net.parameters())
        self.optimizer.state.clear()
        self.nonfinite_batches += 1


def _to_device(x: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """Host tensor to the learner's device: on CUDA through pinned memory, so the copy is asynchronous."""
    if dev.type == "cuda" and x.device.type == "cpu":
        x = x.pin_memory()
    return x.to(dev, non_blocking=True)


def _first_nonfinite(host: dict) -> str:
    """Where non-finite values first showed up in an update ('' when everything was finite)."""
    for flag, where in (("loss_finite", "loss"), ("grads_finite", "gradients"), ("params_finite", "weights")):
        if host[flag] < 1:
            return where
    return ""


def _to_host(scalars: dict, vectors: dict) -> dict:
    """Copy every statistic of the batch to the host in one transfer."""
    names = list(scalars)
    parts = [torch.stack([scalars[k].float() for k in names])] + [v.float().reshape(-1) for v in vectors.values()]
    host = torch.cat(parts).tolist()
    out = dict(zip(names, host[: len(names)]))
    offset = len(names)
    for key, v in vectors.items():
        out[key] = host[offset: offset + v.numel()]
        offset += v.numel()
    for key in ("target_hist", "advantage_hist"):
        if key in out:
            out[key] = (out[key], out.pop(f"{key}_sum"))
    return out
