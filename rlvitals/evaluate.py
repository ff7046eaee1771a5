"""Evaluate a run's latest checkpoint: `rlvitals eval`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from rlvitals.actors.runner import EnvRunner

from .archive import RunArchive
from .config import ConfigError, build_config


def load_network(run_dir: str):
    """(config, network) from a run directory's latest checkpoint; ConfigError (one line) when it cannot be used."""
    from .checkpoint import check_network_fits
    from .env_preflight import check_env_usable
    from .training import atari_options, make_network
    from .validate import check_checkpoint_content

    path = Path(run_dir)
    if not (path / "config.yaml").is_file():
        raise ValueError(f"run_dir={run_dir!r} is invalid: no config.yaml there; expected a run directory")
    ckpt = path / "checkpoints" / "latest.pt"
    state = RunArchive(path).load_checkpoint()
    check_checkpoint_content(ckpt, state, parts=("config", "network"))
    try:  # defaults for fields newer than the run; retired fields dropped; unknown ones refused
        cfg = build_config(None, state["config"])
    except ConfigError as exc:
        raise ConfigError(f"checkpoint {str(ckpt)!r} holds a config this version cannot use: {exc}") from None
    obs_space, action_space = check_env_usable(cfg, atari_options(cfg))
    check_network_fits(ckpt, state)
    net = make_network(cfg, obs_space, action_space)
    net.load_state_dict(state["network"])
    net.eval()
    return cfg, net


class GreedyPolicy:
    def __init__(self, net):
        self.net, self.age = net, net.age

    @torch.no_grad()
    def act(self, obs):
        params = self.net.policy_params(obs)
        dist = self.net.dist
        actions = params.argmax(-1) if hasattr(dist, "n") else params[..., : dist.dim]
        return actions, params, dist.log_prob(params, actions)


def evaluate_run(run_dir: str, episodes: int, greedy: bool = False, seed: int = 12345) -> dict:
    cfg, net = load_network(run_dir)
    torch.manual_seed(seed)
    net.seed(seed)
    from .training import atari_options

    runner = EnvRunner(cfg.env, min(episodes, 16), seed=seed, atari_options=atari_options(cfg),
                       env_kwargs=cfg.env_kwargs)
    policy = GreedyPolicy(net) if greedy else net
    returns: list[float] = []
    try:
        while len(returns) < episodes:
            returns.extend(runner.collect(policy, 256).episodes.returns.tolist())
    finally:
        runner.close()
    r = np.asarray(returns[:episodes])
    return {"run_dir": str(run_dir), "env": cfg.env, "episodes": int(r.size), "greedy": greedy,
            "mean": float(r.mean()), "std": float(r.std()), "min": float(r.min()), "max": float(r.max())}
