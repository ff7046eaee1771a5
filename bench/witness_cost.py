"""The env-output witness's cost, timed directly: EnvRunner.collect with the witness against the same runner
stepping its bare vector env, alternated in one process (CPU seconds of this process, one torch thread).

Usage: python bench/witness_cost.py [--env CartPole-v1] [--rounds 7] [--out bench/results/witness_cost.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))


class _Unwitnessed:
    """The runner's env slot without the witness: the bare vector env, recording nothing."""

    def __init__(self, env):
        self.env = env

    def __getattr__(self, name):
        return getattr(self.env, name)

    def begin(self, num_steps: int) -> None:
        pass

    def take(self):
        return None


def main(argv: list[str] | None = None) -> Path:
    import torch

    from common import machine_info
    from rlvitals.actors.runner import EnvRunner
    from rlvitals.config import TrainConfig
    from rlvitals.training import make_network, seed_everything

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default=str(BENCH / "results" / "witness_cost.json"))
    args = p.parse_args(argv)

    torch.set_num_threads(1)
    cfg = TrainConfig(env=args.env).validate()
    seed_everything(0, 1)
    runner = EnvRunner(cfg.env, cfg.num_envs, 0)
    net = make_network(cfg, runner.obs_space, runner.action_space)
    witness, bare = runner.witness, _Unwitnessed(runner.witness.env)

    def collect_seconds(env) -> float:
        runner.env = runner.witness = env
        start = time.process_time()
        runner.collect(net, cfg.rollout_length)
        return time.process_time() - start

    rounds = {"with_witness": [], "without": []}
    for _ in range(args.rounds):
        for _ in range(3):   # alternated, so drift in the machine's load falls on both alike
            rounds["with_witness"].append(collect_seconds(witness))
            rounds["without"].append(collect_seconds(bare))
    runner.env = runner.witness = witness
    runner.close()
    with_w, without = statistics.median(rounds["with_witness"]), statistics.median(rounds["without"])
    ratios = [a / b for a, b in zip(rounds["with_witness"], rounds["without"], strict=True)]
    result = {"scenario": "witness-cost", "env": args.env, "num_envs": cfg.num_envs,
              "rollout_length": cfg.rollout_length,
              "median_collect_cpu_s": {"with_witness": with_w, "without": without},
              "overhead_fraction": with_w / without - 1,
              "ratio_quartiles": statistics.quantiles(ratios, n=4), "machine": machine_info(),
              "command": " ".join(["python", "bench/witness_cost.py", *(argv or sys.argv[1:])])}
    out = Path(args.out)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"collect CPU s (median): with the witness {with_w:.4f}, without {without:.4f}: "
          f"{100 * result['overhead_fraction']:+.1f}%; per-pair ratio quartiles "
          + ", ".join(f"{q:.3f}" for q in result["ratio_quartiles"]))
    return out


if __name__ == "__main__":
    main()
