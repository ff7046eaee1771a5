"""CartPole-v1 in local mode: seconds from training start to a last-100 mean return of 475.

Usage: python bench/cartpole.py [--seeds 0 1 2]
Target (issue 2): median over 3 seeds under 5 s, at 20,000 env steps/s or more while learning.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import spread, write_result
from rlvitals.archive import RunArchive
from rlvitals.config import TrainConfig
from rlvitals.training import train_local


def run(seed: int, parent: str) -> dict:
    cfg = TrainConfig(env="CartPole-v1", seed=seed, return_threshold=475.0,
                      stop_at_threshold=True, verbosity="off", progress=False,
                      run_dir=f"{parent}/s{seed}").validate()
    archive = RunArchive.create(cfg.run_dir, cfg.to_dict(), ["bench"])
    try:
        summary = train_local(cfg, archive)
    finally:
        archive.close()
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [run(seed, tmp) for seed in args.seeds]
    for seed, s in zip(args.seeds, runs, strict=True):
        print(f"seed {seed}: {s['seconds_to_threshold']} s to 475 ({s['env_steps_to_threshold']} steps), "
              f"{s['env_steps_per_second']:.0f} steps/s")
    figures = {
        "seconds_to_475": spread([r["seconds_to_threshold"] for r in runs]),
        "env_steps_to_475": spread([r["env_steps_to_threshold"] for r in runs]),
        "env_steps_per_second": spread([r["env_steps_per_second"] for r in runs]),
        "solved_runs": sum(r["seconds_to_threshold"] is not None for r in runs),
        "per_seed": [{"seed": s, **{k: r[k] for k in ("seconds_to_threshold", "env_steps_to_threshold",
                                                      "env_steps_per_second", "mean_return_last_100")}}
                     for s, r in zip(args.seeds, runs, strict=True)],
    }
    cfg = TrainConfig().to_dict()
    print(write_result("cartpole_local", {"env": "CartPole-v1", "mode": "local", **cfg}, figures))


if __name__ == "__main__":
    main()
