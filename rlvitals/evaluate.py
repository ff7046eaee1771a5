"""Load a run's checkpoint and evaluate it: `rlvitals eval`, and what `rlvitals.load_policy` builds on."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch

from rlvitals.actors.runner import EnvRunner
from rlvitals.learner.networks import ActorCritic

from .archive import read_checkpoint, resolve_checkpoint
from .config import ConfigError, TrainConfig, build_config


class LoadedCheckpoint(NamedTuple):
    cfg: TrainConfig
    net: ActorCritic
    path: Path
    updates: int | None
    """Batches the run had taken when the checkpoint was written."""
    observation_space: gym.Space
    action_space: gym.Space


def open_checkpoint(run_dir: str | Path | None, checkpoint: str = "latest", env: str | None = None
                    ) -> LoadedCheckpoint:
    """A checkpoint's config and network, in eval mode; ConfigError or ValueError (one line) when unusable.

    `checkpoint` is latest, best or update-<N> of `run_dir`, or a path to a checkpoint file (run_dir
    then may be None); with both, the file must be one of the run's own. The env is built and stepped
    once, and the network must fit its spaces. A checkpoint is data: where its env is `module:EnvId`, the
    module is imported only when the caller names that env (`env`) or has imported the module already.
    """
    from .checkpoint import check_network_fits
    from .env_preflight import atari_options, check_env_usable
    from .training import make_network
    from .validate import check_checkpoint_content

    ckpt = resolve_checkpoint(run_dir, checkpoint)
    state = read_checkpoint(ckpt)
    check_checkpoint_content(ckpt, state, parts=("config", "network"))
    try:  # defaults for fields newer than the run; retired fields dropped; unknown ones refused
        cfg = build_config(None, state["config"])
    except ConfigError as exc:
        raise ConfigError(f"checkpoint {str(ckpt)!r} holds a config this version cannot use: {exc}") from None
    check_env_named(ckpt, cfg.env, env)
    check_own_checkpoint(run_dir, ckpt, state)
    obs_space, action_space = check_env_usable(cfg, atari_options(cfg))
    check_network_fits(ckpt, state)
    net = make_network(cfg, obs_space, action_space)
    net.load_state_dict(state["network"])
    check_loaded_as_saved(ckpt, state, net)
    net.eval()
    updates = state["tracker"].get("updates") if isinstance(state.get("tracker"), dict) else None
    return LoadedCheckpoint(cfg, net, ckpt, updates, obs_space, action_space)


LOADED_LIMIT = 1e-9
"""The relative gap of a loaded network's sums from the fingerprint saved with it above which it is refused
(the same weights give the same float64 sums; a device move rounds far below this)."""


def check_loaded_as_saved(ckpt: Path, state: dict, net) -> None:
    """ValueError (one line) unless the network as loaded has the weights and normaliser statistics the
    checkpoint's fingerprint says were saved: a file changed since it was written, or a load that left part
    of the network at its initial values, would otherwise act as another policy."""
    from .resume_check import network_gaps

    for part, gap in network_gaps(state.get("fingerprint"), net).items():
        if gap > LOADED_LIMIT:
            raise ValueError(f"checkpoint {str(ckpt)!r} is invalid: the network loaded from it differs from the one "
                             f"saved ({part}: relative gap {gap:.3g} of its fingerprint); expected the file as "
                             "rlvitals train wrote it")


def check_env_named(ckpt: Path, trained_on: str, named: str | None) -> None:
    """ConfigError unless building the checkpoint's env imports no module the caller did not ask for.

    `module:EnvId` makes gymnasium import `module`, running its code: the checkpoint (a file from anyone)
    must not choose that. The caller names the env (eval --env, load_policy(env=...)), or has imported
    the module itself (a script that registers its env, then loads a policy)."""
    if named is not None and named != trained_on:
        raise ConfigError(f"env={named!r} is invalid: checkpoint {str(ckpt)!r} was trained on env {trained_on!r}; "
                          "expected that env")
    module = trained_on.partition(":")[0] if ":" in trained_on else None
    if module is None or named == trained_on or module in sys.modules:
        return
    raise ConfigError(f"checkpoint {str(ckpt)!r} was trained on env {trained_on!r}: building it imports module "
                      f"{module!r}, running its code, and a checkpoint never chooses code to run; expected "
                      f"--env {trained_on} (load_policy(..., env={trained_on!r})) if you trust that module")


def check_own_checkpoint(run_dir: str | Path | None, ckpt: Path, state: dict) -> None:
    """ConfigError when a checkpoint file given beside a run directory belongs to another run (the result
    would name one run and hold another's numbers), as a resume refuses it."""
    if run_dir is None:
        return
    from .archive import RunArchive

    try:
        run_id = RunArchive(Path(run_dir)).run_id
    except (OSError, ValueError, KeyError, TypeError):  # no readable meta.json: nothing to tell them apart by
        return
    if state.get("run_id") is not None and str(state["run_id"]) != run_id:
        raise ConfigError(f"checkpoint {str(ckpt)!r} belongs to run {state['run_id']}, not to run {run_id} of "
                          f"run_dir={str(run_dir)!r}; expected one of the run's own checkpoints (latest, best, "
                          "update-<N>), or the checkpoint's path without --run-dir")


def load_network(run_dir: str | Path | None, checkpoint: str = "latest", env: str | None = None
                 ) -> tuple[TrainConfig, ActorCritic]:
    """(config, network) of a run's checkpoint (its latest by default): `open_checkpoint` without the file's facts."""
    loaded = open_checkpoint(run_dir, checkpoint, env)
    return loaded.cfg, loaded.net


class GreedyPolicy:
    """The network acting greedily: the most likely action (discrete), the Gaussian's mean (continuous).

    A recurrent network acts from each env's carried state (`act_recurrent`, as the network itself does), so
    the env runner carries and resets the state for greedy evaluation exactly as it does when sampling."""

    def __init__(self, net):
        self.net, self.age = net, net.age
        self.recurrent_size = net.recurrent_size

    def _greedy(self, params):
        dist = self.net.dist
        actions = params.argmax(-1) if hasattr(dist, "n") else params[..., : dist.dim]
        return actions, params, dist.log_prob(params, actions)

    @torch.no_grad()
    def act(self, obs):
        return self._greedy(self.net.policy_params(obs))

    def initial_state(self, n: int) -> torch.Tensor:
        return self.net.initial_state(n)

    @torch.no_grad()
    def act_recurrent(self, obs, state, starts):
        """(actions, params, log-probs, the state after the step), one step on from each env's state."""
        params, _, state = self.net.step(obs, state, starts)
        return (*self._greedy(params), state)


def acting(net, greedy: bool):
    """What acts for eval and `Policy.predict`: the greedy policy, or the network sampling from its distribution."""
    return GreedyPolicy(net) if greedy else net


def evaluate_run(run_dir: str | None, episodes: int, greedy: bool = True, seed: int = 12345,
                 checkpoint: str = "latest", env: str | None = None) -> dict:
    """Return statistics of `episodes` episodes of a checkpoint (acting greedily unless `greedy` is False);
    `env`: the env the caller allows to be built when the checkpoint's is `module:EnvId` (open_checkpoint)."""
    loaded = open_checkpoint(run_dir, checkpoint, env)
    cfg, net = loaded.cfg, loaded.net
    torch.manual_seed(seed)
    net.seed(seed)
    from .env_preflight import atari_options

    runner = EnvRunner(cfg.env, min(episodes, 16), seed=seed, atari_options=atari_options(cfg),
                       env_kwargs=cfg.env_kwargs)
    policy = acting(net, greedy)
    returns: list[float] = []
    threads = torch.get_num_threads()
    # The run's actors' threads: a step of 16 envs is too small to split, and on a busy machine torch's
    # default (one per core) made each step several times slower.
    torch.set_num_threads(cfg.torch_threads)
    try:
        while len(returns) < episodes:
            returns.extend(runner.collect(policy, 256).episodes.returns.tolist())
    finally:
        torch.set_num_threads(threads)
        runner.close()
    r = np.asarray(returns[:episodes])
    return {"run_dir": None if run_dir is None else str(run_dir), "checkpoint": str(loaded.path),
            "checkpoint_updates": loaded.updates, "env": cfg.env, "episodes": int(r.size), "greedy": greedy,
            "mean": float(r.mean()), "std": float(r.std()), "min": float(r.min()), "max": float(r.max())}
