"""Masked-velocity CartPole to a last-100 mean return of 475: rlvitals's LSTM policy against sb3-contrib's
RecurrentPPO with rl-baselines3-zoo's published settings, side by side on this machine.

Usage: python bench/recurrent_vs_sb3.py [--seeds 0 1 2] [--sb3-python .bench-venv/bin/python]
       [--config bench/configs/cartpole_novelocity_lstm.yaml] [--rlvitals-steps N] [--sb3-steps N]

Both sides see the same task: CartPole-v1 whose observation keeps the cart position and the pole angle
(rlvitals/CartPoleNoVelocity-v1; for SB3 the same two indices of gymnasium's CartPole-v1, the information
rl-zoo3's CartPoleNoVel-v1 leaves, which zeroes the two velocities instead of dropping them). Each run is
a fresh process of its own virtual environment (rlvitals: this checkout's `.venv`; SB3: a bench-only venv
with `stable-baselines3 sb3-contrib`, see bench/README.md), one torch thread each, seeds interleaved
(rlvitals seed s, SB3 seed s, ...) so a noisy neighbour hits both alike. Seconds count from before the
envs and the network are built to the first batch after which the last 100 finished episodes average 475
or more; env steps per second are all env steps over the whole run's seconds. A run that does not reach
475 stops at its step budget (SB3: the zoo's n_timesteps, 1e5, over which its learning rate and clip
range anneal, unless --sb3-steps says otherwise).

SB3 side, rl-baselines3-zoo hyperparams/ppo_lstm.yml, CartPoleNoVel-v1 (rl_zoo3 2.9.2): normalize: True
(VecNormalize, gamma 0.98), n_envs 8, n_timesteps 1e5, MlpLstmPolicy, n_steps 32, batch_size 256,
gae_lambda 0.8, gamma 0.98, n_epochs 20, ent_coef 0.0, learning_rate lin_0.001, clip_range lin_0.2,
policy_kwargs ortho_init=False, activation_fn=nn.ReLU, lstm_hidden_size=64, enable_critic_lstm=True,
net_arch=dict(pi=[64], vf=[64]).

Writes bench/results/recurrent_vs_sb3.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
THRESHOLD = 475.0
ZOO = {"normalize": True, "n_envs": 8, "n_timesteps": 100_000, "policy": "MlpLstmPolicy", "n_steps": 32,
       "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20, "ent_coef": 0.0,
       "learning_rate": "lin_0.001", "clip_range": "lin_0.2",
       "policy_kwargs": {"ortho_init": False, "activation_fn": "nn.ReLU", "lstm_hidden_size": 64,
                         "enable_critic_lstm": True, "net_arch": {"pi": [64], "vf": [64]}}}
"""rl-baselines3-zoo's hyperparams/ppo_lstm.yml entry for CartPoleNoVel-v1, as published."""


# ------------------------------------------------------------------------------------------ SB3 side
def sb3_run(seed: int, steps: int) -> dict:
    """One RecurrentPPO run with the zoo's settings; imports only what the bench venv holds."""
    import collections

    import gymnasium as gym
    import numpy as np
    import sb3_contrib
    import stable_baselines3
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)

    class PositionAndAngle(gym.ObservationWrapper):
        """CartPole-v1 with velocities 1 and 3 removed: rlvitals/CartPoleNoVelocity-v1's observation."""

        def __init__(self, env):
            super().__init__(env)
            box = env.observation_space
            self.observation_space = gym.spaces.Box(box.low[[0, 2]], box.high[[0, 2]], dtype=box.dtype)

        def observation(self, observation):
            return observation[[0, 2]]

    def linear(initial: float):  # the zoo's lin_<x>: x times the remaining progress
        return lambda progress_remaining: progress_remaining * initial

    class Watch(BaseCallback):
        def __init__(self, started: float):
            super().__init__()
            self.started, self.window = started, collections.deque(maxlen=100)
            self.solved_s = self.solved_steps = None
            self.best = None

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:   # Monitor's raw return, under VecNormalize's scaling
                    self.window.append(info["episode"]["r"])
            if len(self.window) == self.window.maxlen:
                mean = float(np.mean(self.window))
                self.best = mean if self.best is None else max(self.best, mean)
                if mean >= THRESHOLD and self.solved_s is None:
                    self.solved_s, self.solved_steps = time.perf_counter() - self.started, self.num_timesteps
                    return False
            return True

    started = time.perf_counter()
    env = make_vec_env("CartPole-v1", n_envs=ZOO["n_envs"], seed=seed, wrapper_class=PositionAndAngle)
    env = VecNormalize(env, gamma=ZOO["gamma"])
    model = RecurrentPPO(
        "MlpLstmPolicy", env, n_steps=ZOO["n_steps"], batch_size=ZOO["batch_size"], gae_lambda=ZOO["gae_lambda"],
        gamma=ZOO["gamma"], n_epochs=ZOO["n_epochs"], ent_coef=ZOO["ent_coef"], learning_rate=linear(0.001),
        clip_range=linear(0.2), seed=seed, device="cpu", verbose=0,
        policy_kwargs={"ortho_init": False, "activation_fn": torch.nn.ReLU, "lstm_hidden_size": 64,
                       "enable_critic_lstm": True, "net_arch": {"pi": [64], "vf": [64]}})
    watch = Watch(started)
    model.learn(total_timesteps=steps, callback=watch)
    wall = time.perf_counter() - started
    return {"side": "sb3", "seed": seed, "seconds_to_475": watch.solved_s, "env_steps_to_475": watch.solved_steps,
            "env_steps": int(model.num_timesteps), "wall_seconds": wall,
            "env_steps_per_second": model.num_timesteps / wall,
            "last_100_mean_return": float(np.mean(watch.window)) if watch.window else None,
            "best_last_100_mean_return": watch.best,
            "versions": {"stable-baselines3": stable_baselines3.__version__, "sb3-contrib": sb3_contrib.__version__,
                         "torch": torch.__version__, "gymnasium": gym.__version__, "numpy": np.__version__}}


# ------------------------------------------------------------------------------------- rlvitals side
def rlvitals_run(seed: int, config: str, overrides: dict, steps: int | None, threshold: float = THRESHOLD) -> dict:
    """One local rlvitals run of the config file (none: ""); the solved moment is seen by the run's own tracker.
    An infinite threshold runs the whole budget."""
    import math
    import tempfile

    import rlvitals.tracker as tracker
    from rlvitals.archive import RunArchive
    from rlvitals.config import build_config
    from rlvitals.training import train_local

    seen = {"best": None, "solved_s": None, "solved_steps": None}
    add_rollout = tracker.RunTracker.add_rollout

    def watched(self, rollout):   # the same 100-episode window the run's own solved time reads
        add_rollout(self, rollout)
        if len(self.window) == self.window.maxlen:
            mean = self.mean_return()
            seen["best"] = mean if seen["best"] is None else max(seen["best"], mean)
            if mean >= threshold and seen["solved_s"] is None:
                seen["solved_s"], seen["solved_steps"] = time.perf_counter() - started, self.env_steps

    tracker.RunTracker.add_rollout = watched
    with tempfile.TemporaryDirectory() as tmp:
        fields = {"seed": seed, "verbosity": "off", "progress": False, "run_dir": f"{tmp}/run", **overrides}
        if math.isfinite(threshold):
            fields.update(return_threshold=threshold, stop_at_threshold=True)
        if steps:
            fields["total_env_steps"] = steps
        started = time.perf_counter()
        cfg = build_config(config or None, fields)
        archive = RunArchive.create(cfg.run_dir, cfg.to_dict(), ["bench"])
        try:
            summary = train_local(cfg, archive)
        finally:
            archive.close()
        wall = time.perf_counter() - started
    return {"side": "rlvitals", "seed": seed, "seconds_to_475": seen["solved_s"],
            "env_steps_to_475": seen["solved_steps"], "env_steps": summary["env_steps"], "wall_seconds": wall,
            "env_steps_per_second": summary["env_steps"] / wall,
            "last_100_mean_return": summary["mean_return_last_100"], "best_last_100_mean_return": seen["best"],
            "run_seconds_to_threshold": summary["seconds_to_threshold"], "config": cfg.to_dict()}


# ----------------------------------------------------------------------------------------- driver
def one(python: str, args: list[str]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run([python, str(Path(__file__).resolve()), *args], cwd=REPO, env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--config", default=str(REPO / "bench" / "configs" / "cartpole_novelocity_lstm.yaml"))
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a field of the rlvitals config")
    parser.add_argument("--rlvitals-steps", type=int, default=None, help="rlvitals's budget (default: the config's)")
    parser.add_argument("--sb3-steps", type=int, default=ZOO["n_timesteps"])
    parser.add_argument("--sb3-python", default=str(REPO / ".bench-venv" / "bin" / "python"))
    parser.add_argument("--rlvitals-python", default=sys.executable)
    parser.add_argument("--sides", nargs="+", default=["rlvitals", "sb3", "feedforward"],
                        choices=["rlvitals", "sb3", "feedforward"],
                        help="feedforward: rlvitals with the same settings and budget but recurrent_size 0")
    parser.add_argument("--name", default="recurrent_vs_sb3", help="result file name under bench/results/")
    parser.add_argument("--worker", choices=["rlvitals", "sb3"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--threshold", type=float, default=THRESHOLD, help=argparse.SUPPRESS)
    args = parser.parse_args()
    overrides = dict(item.split("=", 1) for item in args.set)
    if args.worker == "sb3":
        print(json.dumps(sb3_run(args.seed, args.sb3_steps)))
        return
    if args.worker == "rlvitals":
        print(json.dumps(rlvitals_run(args.seed, args.config, overrides, args.rlvitals_steps, args.threshold)))
        return
    if "sb3" in args.sides and not Path(args.sb3_python).exists():
        parser.error(f"--sb3-python {args.sb3_python} is missing: make the bench venv (bench/README.md)")
    runs: dict[str, list[dict]] = {side: [] for side in args.sides}
    for seed in args.seeds:
        for side in args.sides:
            python = args.sb3_python if side == "sb3" else args.rlvitals_python
            extra = [f"--set={s}" for s in args.set] + (
                [f"--rlvitals-steps={args.rlvitals_steps}"] if args.rlvitals_steps else []) + (
                ["--set=recurrent_size=0"] if side == "feedforward" else [])
            run = one(python, ["--worker", "sb3" if side == "sb3" else "rlvitals", "--seed", str(seed),
                               "--config", args.config, f"--sb3-steps={args.sb3_steps}", *extra])
            run["side"] = side
            runs[side].append(run)
            solved = (f"{run['seconds_to_475']:.1f} s to 475 ({run['env_steps_to_475']:,} steps)"
                      if run["seconds_to_475"] is not None else
                      f"not solved in {run['env_steps']:,} steps (best last-100 {run['best_last_100_mean_return']})")
            print(f"seed {seed} {side}: {solved}, {run['env_steps_per_second']:,.0f} env steps/s", flush=True)

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import spread, write_result

    figures: dict = {}
    for side, side_runs in runs.items():
        figures[side] = {
            "seconds_to_475": spread([r["seconds_to_475"] for r in side_runs]),
            "env_steps_to_475": spread([r["env_steps_to_475"] for r in side_runs]),
            "env_steps_per_second": spread([r["env_steps_per_second"] for r in side_runs]),
            "best_last_100_mean_return": spread([r["best_last_100_mean_return"] for r in side_runs]),
            "solved_runs": sum(r["seconds_to_475"] is not None for r in side_runs), "runs": len(side_runs),
            "per_seed": side_runs}
    if {"rlvitals", "sb3"} <= set(runs):
        def ratio(key: str, inverse: bool = False) -> float | None:
            a, b = figures["rlvitals"][key]["median"], figures["sb3"][key]["median"]
            if a is None or b is None:
                return None
            return b / a if inverse else a / b
        figures["rlvitals_speedup"] = {
            "time_to_475_sb3_over_rlvitals": ratio("seconds_to_475", inverse=True),
            "env_steps_per_second_rlvitals_over_sb3": ratio("env_steps_per_second"),
            "env_steps_to_475_sb3_over_rlvitals": ratio("env_steps_to_475", inverse=True),
            "targets": {"time_to_475": 3.0, "env_steps_per_second": 5.0}}
        print(json.dumps(figures["rlvitals_speedup"]))
    config = {"env": "rlvitals/CartPoleNoVelocity-v1 (SB3: CartPole-v1 observing indices 0 and 2)",
              "threshold": THRESHOLD, "seeds": args.seeds, "rlvitals_config_file": os.path.relpath(args.config, REPO),
              "rlvitals_overrides": overrides, "rlvitals_steps": args.rlvitals_steps, "sb3_steps": args.sb3_steps,
              "sb3_zoo_hyperparams": ZOO, "torch_threads": 1}
    print(write_result("recurrent_vs_sb3", config, figures, name=args.name))


if __name__ == "__main__":
    main()
