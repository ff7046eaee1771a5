"""What the loss-direction diagnostic costs: its time per minibatch against the minibatch step it rides on.

The diagnostic (learner/diagnostics.py `loss_directions`) keeps the gradients
of three network outputs and reduces them once per minibatch. This times, on
the learner's real network for CartPole-v1 and a default-sized minibatch, the
optimizer step (forward, loss, backward, clip, Adam) and, inside it, the
diagnostic's own calls, in alternating blocks, CPU time, best block of each.
The learner runs the diagnostic on one minibatch per update, so its share of
the update is its time over (steps per update x step time). Timed directly
rather than as a throughput ratio: on this shared 2-core machine whole-run
throughput varies by more than the effect.

Usage: python bench/loss_directions_cost.py [--blocks 15] [--steps 200]
Target (issue 11): the new diagnostics stay within the telemetry budget, under 2% of training at `standard`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import gymnasium as gym
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result
from rlvitals.config import TrainConfig
from rlvitals.learner import diagnostics
from rlvitals.learner.ppo import ppo_loss
from rlvitals.parts import make_network, ppo_settings


def step_seconds(net, opt, batch: dict, settings, measure: bool, steps: int) -> tuple[float, float]:
    """(CPU seconds per minibatch step, of which spent in the diagnostic itself), measuring on every step or never."""
    start, in_diagnostic = time.process_time(), 0.0
    for _ in range(steps):
        params, values = net(batch["obs"])
        logp = net.dist.log_prob(params, batch["actions"])
        entropy = net.dist.entropy(params)
        if measure:
            t0 = time.process_time()
            for output in (logp, values, entropy):
                output.retain_grad()
            in_diagnostic += time.process_time() - t0
        loss, parts = ppo_loss(logp, batch["logp"], values, batch["adv"], batch["targets"], entropy, settings)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        if measure:
            t0 = time.process_time()
            parts.update(diagnostics.loss_directions(logp, values, entropy, batch["adv"], batch["targets"],
                                                     settings.normalize_advantages))
            in_diagnostic += time.process_time() - t0
        torch.nn.utils.clip_grad_norm_(net.parameters(), settings.max_grad_norm)
        opt.step()
    return (time.process_time() - start) / steps, in_diagnostic / steps


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=15)
    p.add_argument("--steps", type=int, default=200, help="minibatch steps per block")
    args = p.parse_args(argv)
    cfg = TrainConfig(env="CartPole-v1", seed=0).validate()
    env = gym.make(cfg.env)
    net = make_network(cfg, env.observation_space, env.action_space)
    settings = ppo_settings(cfg)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.learning_rate)
    size = cfg.num_envs * cfg.rollout_length // cfg.num_minibatches
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        obs = torch.randn(size, *env.observation_space.shape, generator=g)
        params, _ = net(obs)
        actions, logp = net.dist.sample(params, g)
        batch = {"obs": obs, "actions": actions, "logp": logp,
                 "adv": torch.randn(size, generator=g), "targets": torch.randn(size, generator=g)}
    per_update = cfg.update_epochs * cfg.num_minibatches   # the learner measures one minibatch per update
    plain, measured, inside = [], [], []
    for _ in range(args.blocks):
        plain.append(step_seconds(net, opt, batch, settings, False, args.steps)[0])
        total, diagnostic = step_seconds(net, opt, batch, settings, True, args.steps)
        measured.append(total)
        inside.append(diagnostic)
    step, diagnostic = min(plain), min(inside)
    cost = diagnostic / (per_update * step)
    print(f"minibatch of {size}: {1e3 * step:.3f} ms per optimizer step; the diagnostic {1e3 * diagnostic:.3f} ms "
          f"({100 * diagnostic / step:.1f}% of a step), taken once per update of {per_update} steps: "
          f"{100 * cost:.2f}% of the learner's update time")
    return write_result("loss_directions_cost", {"env": cfg.env, "minibatch": size, "blocks": args.blocks,
                                                 "steps_per_block": args.steps, "torch_threads":
                                                 torch.get_num_threads()},
                        {"seconds_per_optimizer_step": step, "seconds_in_diagnostic": diagnostic,
                         "seconds_per_step_while_measuring": min(measured), "optimizer_steps_per_update": per_update,
                         "cost_fraction_of_update": cost})


if __name__ == "__main__":
    print(main())
