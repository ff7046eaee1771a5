"""The MuJoCo preset's env steps per second against Stable-Baselines3 PPO with the same hyperparameters, side by side
on this machine (issue 33's target: at least 2x).

Usage: python bench/mujoco_vs_sb3.py [--envs HalfCheetah-v5 Hopper-v5] [--seeds 0] [--steps 204800]
       [--sides sb3 local ray] [--sb3-python .bench-venv/bin/python]

The hyperparameters are CleanRL ppo_continuous_action.py's (rlvitals's `mujoco` preset): one env, 2,048-step
rollouts, 10 epochs of 32 minibatches of 64, learning rate 3e-4 annealed to 0, gamma 0.99, GAE lambda 0.95, clip
0.2, no entropy bonus, value coefficient 0.5, gradient norm clipped at 0.5, observations and rewards normalised,
two 64x64 tanh MLPs. SB3's side sets the same (its MlpPolicy is already two 64x64 tanh MLPs with orthogonal
initialisation; VecNormalize with gamma 0.99; learning rate a linear schedule to 0).

Sides, each a fresh process with one torch thread, seeds and sides interleaved so a noisy neighbour hits all alike:
- `sb3`: stable_baselines3.PPO in the bench venv (bench/README.md).
- `local`: `rlvitals train --preset mujoco`, one process, deterministic: collection, then learning.
- `ray`: the same preset with `--mode ray --num-actors 1`: one actor process steps the env while the learner
  learns (rollouts_in_flight 2, so a rollout may come from weights an update or two old; PPO's ratio uses the
  stored behaviour log-probabilities). This is how rlvitals overlaps env stepping with learning.

Env steps per second are all env steps over the run's wall seconds, start-up included (Ray's too). The last-100
mean return is reported beside them, not judged (these budgets are far below the published 1M).

Writes bench/results/mujoco_vs_sb3.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLEANRL = {"n_envs": 1, "n_steps": 2048, "batch_size": 64, "n_epochs": 10, "learning_rate": 3e-4, "gamma": 0.99,
           "gae_lambda": 0.95, "clip_range": 0.2, "ent_coef": 0.0, "vf_coef": 0.5, "max_grad_norm": 0.5,
           "normalize": True, "net_arch": "64x64 tanh, separate policy and value"}
"""CleanRL ppo_continuous_action.py's settings, in SB3's names."""


def sb3_run(env_id: str, seed: int, steps: int) -> dict:
    """One SB3 PPO run; imports only what the bench venv holds."""
    import numpy as np
    import stable_baselines3
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    started = time.perf_counter()
    env = VecNormalize(make_vec_env(env_id, n_envs=CLEANRL["n_envs"], seed=seed), gamma=CLEANRL["gamma"])
    model = PPO("MlpPolicy", env, n_steps=CLEANRL["n_steps"], batch_size=CLEANRL["batch_size"],
                n_epochs=CLEANRL["n_epochs"], learning_rate=lambda remaining: remaining * CLEANRL["learning_rate"],
                gamma=CLEANRL["gamma"], gae_lambda=CLEANRL["gae_lambda"], clip_range=CLEANRL["clip_range"],
                ent_coef=CLEANRL["ent_coef"], vf_coef=CLEANRL["vf_coef"], max_grad_norm=CLEANRL["max_grad_norm"],
                seed=seed, device="cpu", verbose=0)
    model.learn(total_timesteps=steps)
    wall = time.perf_counter() - started
    returns = [info["r"] for info in model.ep_info_buffer]   # Monitor's raw returns, the last 100
    return {"env_steps": int(model.num_timesteps), "wall_seconds": wall,
            "env_steps_per_second": model.num_timesteps / wall,
            "last_100_mean_return": float(np.mean(returns)) if returns else None,
            "versions": {"stable-baselines3": stable_baselines3.__version__, "torch": torch.__version__}}


def rlvitals_run(env_id: str, seed: int, steps: int, mode: str) -> dict:
    """One `rlvitals train --preset mujoco` run, as a user starts it (the CLI, in this process)."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "rlvitals.cli", "train", "--preset", "mujoco", "--env", env_id,
                "--seed", str(seed), "--total-env-steps", str(steps), "--run-dir", f"{tmp}/run",
                "--progress", "false"]
        if mode == "ray":
            argv += ["--mode", "ray", "--num-actors", "1"]
        started = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, text=True, cwd=REPO)
        wall = time.perf_counter() - started
        summary = json.loads(Path(f"{tmp}/run/summary.json").read_text())
    return {"env_steps": summary["env_steps"], "wall_seconds": wall,
            "env_steps_per_second": summary["env_steps"] / wall,
            "run_env_steps_per_second": summary["env_steps_per_second"],
            "last_100_mean_return": summary["mean_return_last_100"], "verdicts": summary["verdicts"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["HalfCheetah-v5"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=100 * 2048)
    parser.add_argument("--sides", nargs="+", default=["sb3", "local", "ray"], choices=["sb3", "local", "ray"])
    parser.add_argument("--sb3-python", default=str(REPO / ".bench-venv" / "bin" / "python"))
    parser.add_argument("--name", default="mujoco_vs_sb3")
    parser.add_argument("--worker", choices=["sb3", "local", "ray"], help=argparse.SUPPRESS)
    parser.add_argument("--env", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "sb3":
        print(json.dumps(sb3_run(args.env, args.seed, args.steps)))
        return
    if args.worker:
        print(json.dumps(rlvitals_run(args.env, args.seed, args.steps, args.worker)))
        return
    if "sb3" in args.sides and not Path(args.sb3_python).exists():
        parser.error(f"--sb3-python {args.sb3_python} is missing: make the bench venv (bench/README.md)")
    child_env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    runs: dict[str, dict[str, list[dict]]] = {env: {side: [] for side in args.sides} for env in args.envs}
    for env_id in args.envs:
        for seed in args.seeds:
            for side in args.sides:
                python = args.sb3_python if side == "sb3" else sys.executable
                out = subprocess.run([python, str(Path(__file__).resolve()), "--worker", side, "--env", env_id,
                                      "--seed", str(seed), "--steps", str(args.steps)],
                                     cwd=REPO, env=child_env, check=True, capture_output=True, text=True)
                run = {"seed": seed, **json.loads(out.stdout.strip().splitlines()[-1])}
                runs[env_id][side].append(run)
                print(f"{env_id} seed {seed} {side}: {run['env_steps_per_second']:,.0f} env steps/s, "
                      f"last-100 return {run['last_100_mean_return']}", flush=True)

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import spread, write_result

    figures: dict = {}
    for env_id, sides in runs.items():
        figures[env_id] = {side: {"env_steps_per_second": spread([r["env_steps_per_second"] for r in side_runs]),
                                  "last_100_mean_return": spread([r["last_100_mean_return"] for r in side_runs]),
                                  "per_seed": side_runs} for side, side_runs in sides.items()}
        if "sb3" in sides:
            sb3 = figures[env_id]["sb3"]["env_steps_per_second"]["median"]
            figures[env_id]["over_sb3"] = {side: figures[env_id][side]["env_steps_per_second"]["median"] / sb3
                                           for side in sides if side != "sb3"}
            print(env_id, json.dumps(figures[env_id]["over_sb3"]))
    config = {"envs": args.envs, "seeds": args.seeds, "env_steps": args.steps, "sides": args.sides,
              "hyperparameters": CLEANRL, "torch_threads": 1, "target_over_sb3": 2.0}
    print(write_result("mujoco_vs_sb3", config, figures, name=args.name))


if __name__ == "__main__":
    main()
