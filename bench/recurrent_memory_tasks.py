"""A memory task from the package registry: rlvitals's LSTM policy against its feed-forward one at a fixed budget.

Usage: python bench/recurrent_memory_tasks.py [--env popgym:popgym-RepeatPreviousEasy-v0] [--steps 400000]
       [--seeds 0] [--set FIELD=VALUE ...]

Needs the `memory` extra (`pip install -e '.[memory]'`: popgym). popgym's RepeatPreviousEasy-v0 deals one
52-card deck a card a step (observation: the suit, Discrete(4)) and rewards +-1/48 a step for naming the
suit dealt 4 steps earlier (action Discrete(4)): 1.0 per episode for perfect recall, -0.5 for a guess.
The current card says nothing about the one 4 steps back beyond what the deck's depletion leaks, so a
feed-forward policy stays near -0.5; a recurrent one must remember. Both sides run the same settings
(the TrainConfig defaults and the fields below) but `recurrent_size`, one process each, seeds interleaved.
Writes bench/results/recurrent_memory_tasks.json: the last-100 mean return of each at the budget and the
best last-100 mean seen during the run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SETTINGS = {"num_envs": 32, "rollout_length": 128, "num_minibatches": 4, "update_epochs": 4,
            "learning_rate": 2.5e-3, "entropy_coef": 0.01, "hidden_sizes": "64"}
"""Shared by both policies; not tuned beyond one look (the defaults, an entropy bonus, 4 minibatches of 8 envs)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="popgym:popgym-RepeatPreviousEasy-v0")
    parser.add_argument("--steps", type=int, default=400_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--recurrent-size", type=int, default=64)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--name", default="recurrent_memory_tasks")
    args = parser.parse_args()
    fields = {**SETTINGS, **dict(item.split("=", 1) for item in args.set), "env": args.env}
    runs: dict[str, list[dict]] = {"recurrent": [], "feed_forward": []}
    for seed in args.seeds:
        for side, size in (("recurrent", args.recurrent_size), ("feed_forward", 0)):
            sets = [f"--set={k}={v}" for k, v in {**fields, "recurrent_size": size}.items()]
            # recurrent_vs_sb3's rlvitals worker: one run in its own process, the config file left out
            out = subprocess.run([sys.executable, str(REPO / "bench" / "recurrent_vs_sb3.py"), "--worker", "rlvitals",
                                  "--seed", str(seed), "--config", "", f"--rlvitals-steps={args.steps}",
                                  "--threshold", "inf", *sets], cwd=REPO, check=True, capture_output=True, text=True,
                                 env={**os.environ, "OMP_NUM_THREADS": "1"})
            run = json.loads(out.stdout.strip().splitlines()[-1])
            run.pop("config")
            runs[side].append(run)
            print(f"seed {seed} {side}: last-100 return {run['last_100_mean_return']:.3f} "
                  f"(best {run['best_last_100_mean_return']:.3f}) after {run['env_steps']:,} steps, "
                  f"{run['env_steps_per_second']:,.0f} env steps/s", flush=True)

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import spread, write_result

    figures = {side: {"last_100_mean_return": spread([r["last_100_mean_return"] for r in side_runs]),
                      "best_last_100_mean_return": spread([r["best_last_100_mean_return"] for r in side_runs]),
                      "env_steps_per_second": spread([r["env_steps_per_second"] for r in side_runs]),
                      "per_seed": side_runs}
               for side, side_runs in runs.items()}
    config = {**fields, "recurrent_size": args.recurrent_size, "steps": args.steps, "seeds": args.seeds,
              "perfect_recall_return": 1.0, "guess_return": -0.5, "popgym": metadata.version("popgym")}
    print(write_result("recurrent_memory_tasks", config, figures, name=args.name))


if __name__ == "__main__":
    main()
