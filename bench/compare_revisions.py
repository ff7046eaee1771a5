"""Two checkouts' CartPole benchmark, interleaved on one machine: does a change regress it?

Usage: python bench/compare_revisions.py --old DIR [--new DIR] [--rounds 3]

Each checkout runs its own `bench/cartpole.py` with its own virtual environment (`DIR/.venv`),
old and new alternating round by round so that a noisy neighbour hits both alike. Each call leaves
its `bench/results/cartpole_local.json` in its own checkout; this script reads it back, so a checkout
from before this script existed can be compared as well. Writes `bench/results/cartpole_old_vs_new.json`
with every round and the ratios new/old of the medians over all seeds of all rounds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import spread, write_result

REPO = Path(__file__).resolve().parent.parent


def describe(checkout: Path) -> str:
    result = subprocess.run(["git", "-C", str(checkout), "log", "-1", "--format=%h %s"],
                            capture_output=True, text=True)
    return result.stdout.strip()[:100] or str(checkout)


def one_round(checkout: Path, seeds: list[int]) -> list[dict]:
    python = checkout / ".venv" / "bin" / "python"
    subprocess.run([str(python), str(checkout / "bench" / "cartpole.py"), "--seeds", *map(str, seeds)],
                   cwd=checkout, check=True, stdout=subprocess.DEVNULL)
    result = json.loads((checkout / "bench" / "results" / "cartpole_local.json").read_text())
    return result["figures"]["per_seed"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the checkout before the change")
    parser.add_argument("--new", type=Path, default=REPO, help="the checkout with it (default: this one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    for checkout in (args.old, args.new):
        if not (checkout / ".venv" / "bin" / "python").exists() or not (checkout / "bench" / "cartpole.py").exists():
            parser.error(f"--old/--new {checkout} is invalid: expected a checkout with .venv and bench/cartpole.py")
    rounds = {"old": [], "new": []}
    for index in range(args.rounds):
        for side, checkout in (("old", args.old), ("new", args.new)):
            per_seed = one_round(checkout, args.seeds)
            rounds[side].append(per_seed)
            print(f"round {index + 1} {side}: " + ", ".join(
                f"s{r['seed']} {r['seconds_to_threshold']:.2f} s, {r['env_steps_per_second']:.0f} steps/s"
                if r["seconds_to_threshold"] is not None else f"s{r['seed']} unsolved" for r in per_seed))
    figures = {}
    for side in ("old", "new"):
        runs = [r for per_seed in rounds[side] for r in per_seed]
        figures[side] = {
            "seconds_to_475": spread([r["seconds_to_threshold"] for r in runs]),
            "env_steps_to_475": spread([r["env_steps_to_threshold"] for r in runs]),
            "env_steps_per_second": spread([r["env_steps_per_second"] for r in runs]),
            "solved_runs": sum(r["seconds_to_threshold"] is not None for r in runs), "runs": len(runs),
            "rounds": rounds[side]}
    figures["ratio_new_over_old"] = {
        key: figures["new"][key]["median"] / figures["old"][key]["median"]
        for key in ("seconds_to_475", "env_steps_to_475", "env_steps_per_second")
        if figures["old"][key]["median"] and figures["new"][key]["median"] is not None}
    print(json.dumps(figures["ratio_new_over_old"]))
    config = {"old": describe(args.old), "new": describe(args.new), "rounds": args.rounds, "seeds": args.seeds}
    print(write_result("cartpole_old_vs_new", config, figures))


if __name__ == "__main__":
    main()
