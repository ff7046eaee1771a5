"""Every preset on its family's standard envs at the published budgets, beside the published returns (issue 33).

Usage: python bench/baselines.py [--envs CartPole-v1 Acrobot-v1 ...] [--seeds 0 1 2] [--again]
       python bench/baselines.py --table     # the table from the runs recorded so far, no new run

Each run is `rlvitals train --preset P --env E --seed S --total-env-steps BUDGET` as a user types it (P: the
preset of the env's family, rlvitals/presets), one at a time, one torch thread. A run's result is appended to
bench/results/baselines_runs.jsonl as soon as it ends, and runs already recorded for the same env, seed, budget
and code version are not run again (unless --again): the whole table takes days of this 2-core machine, so it is
filled over several sittings. bench/results/baselines.json holds the table: per env the mean and standard
deviation over seeds of the figure the published one is of: the last-100 mean training return (episodes of the
stochastic policy) beside CleanRL's, and the final policy acting greedily for 50 episodes (`rlvitals eval`) beside
the zoo's deterministic evaluations; the published figure with its source, whether the mean reaches it, and every
verdict the runs raised (a healthy run must end with none at warning or critical).

Published figures (the budget is the one they were measured at):
- CleanRL ppo.py, classic control, 500k steps: docs.cleanrl.dev/rl-algorithms/ppo (ppo.py's table).
- CleanRL ppo_continuous_action.py, MuJoCo v4, 1M steps (openrlbenchmark tag pr-424): the same page; we run the
  v5 envs gymnasium ships (same models and rewards; v5 fixes bugs of v4).
- rl-baselines3-zoo benchmark.md, PPO, for the envs CleanRL does not publish (Ant, LunarLander): one run each,
  evaluated with the deterministic policy, tuned per env by the zoo (our presets are not those tunings).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
RUNS = RESULTS / "baselines_runs.jsonl"

CLEANRL_PPO = "CleanRL ppo.py (docs.cleanrl.dev/rl-algorithms/ppo), 3 seeds"
CLEANRL_MUJOCO = "CleanRL ppo_continuous_action.py, MuJoCo v4, openrlbenchmark tag pr-424 (docs.cleanrl.dev), 3 seeds"
ZOO = "rl-baselines3-zoo benchmark.md, PPO, one run, deterministic evaluation"


EVAL_EPISODES = 50
"""Episodes of the final policy acting greedily, per run (the zoo's figures are of its deterministic policy)."""
EVAL_SEED = 10_000
"""The greedy evaluation's env seed is this plus the run's seed: episodes the training never saw."""


@dataclasses.dataclass(frozen=True)
class Published:
    mean: float
    std: float
    budget: int
    source: str

    @property
    def greedy(self) -> bool:
        """Whether the figure is of the deterministic policy (the zoo's) rather than of training episodes."""
        return self.source.startswith(ZOO)


PUBLISHED = {
    "CartPole-v1": Published(490.04, 6.12, 500_000, CLEANRL_PPO),
    "Acrobot-v1": Published(-86.36, 1.32, 500_000, CLEANRL_PPO),
    "InvertedPendulum-v5": Published(963.09, 22.20, 1_000_000, CLEANRL_MUJOCO + " (InvertedPendulum-v4)"),
    "HalfCheetah-v5": Published(1442.64, 46.03, 1_000_000, CLEANRL_MUJOCO + " (HalfCheetah-v4)"),
    "Hopper-v5": Published(2382.86, 271.74, 1_000_000, CLEANRL_MUJOCO + " (Hopper-v4)"),
    "Walker2d-v5": Published(2287.95, 571.78, 1_000_000, CLEANRL_MUJOCO + " (Walker2d-v4)"),
    "Humanoid-v5": Published(716.11, 49.08, 1_000_000, CLEANRL_MUJOCO + " (Humanoid-v4)"),
    "Ant-v5": Published(1327.158, 451.577, 1_000_000, ZOO + " (Ant-v3)"),
    "LunarLander-v3": Published(242.119, 31.823, 1_000_000, ZOO + " (LunarLander-v2)"),
}
"""The published mean return (and its spread) per env, at the budget it was published for."""


def code_version() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def one_run(env: str, seed: int, budget: int) -> dict:
    """`rlvitals train --preset <the env's family's>` for `budget` steps; the summary's figures."""
    from rlvitals.presets import family_preset

    preset = family_preset(env)
    if preset is None:
        raise SystemExit(f"env {env!r} belongs to no family with a preset")
    with tempfile.TemporaryDirectory(prefix="bench-baselines-") as tmp:
        argv = [sys.executable, "-m", "rlvitals.cli", "train", "--preset", preset.name, "--env", env,
                "--seed", str(seed), "--total-env-steps", str(budget), "--run-dir", f"{tmp}/run",
                "--progress", "false"]
        started = time.perf_counter()
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"{env} seed {seed}: rlvitals train exited {proc.returncode}: {proc.stderr[-2000:]}")
        summary = json.loads(Path(f"{tmp}/run/summary.json").read_text())
        verdicts = json.loads(Path(f"{tmp}/run/verdicts.json").read_text())
        # The zoo's figures are of the deterministic policy: the final checkpoint acting greedily, as `rlvitals eval`.
        evaluated = subprocess.run([sys.executable, "-m", "rlvitals.cli", "eval", "--run-dir", f"{tmp}/run",
                                    "--episodes", str(EVAL_EPISODES), "--seed", str(EVAL_SEED + seed)],
                                   cwd=REPO, capture_output=True, text=True)
        greedy = json.loads(evaluated.stdout.strip().splitlines()[-1]) if evaluated.returncode == 0 else None
    return {"env": env, "seed": seed, "budget": budget, "preset": preset.name, "code_version": code_version(),
            "last_100_mean_return": summary["mean_return_last_100"], "env_steps": summary["env_steps"],
            "greedy_mean_return": greedy.get("mean") if greedy else None, "greedy_episodes": EVAL_EPISODES,
            "greedy_checkpoint_updates": greedy.get("checkpoint_updates") if greedy else None,
            "wall_seconds": round(wall, 1), "env_steps_per_second": summary["env_steps_per_second"],
            "verdict_counts": summary["verdicts"],
            "verdicts": [{k: v.get(k) for k in ("rule", "severity", "component", "first_update")} for v in verdicts],
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def recorded() -> list[dict]:
    if not RUNS.exists():
        return []
    return [json.loads(line) for line in RUNS.read_text().splitlines() if line.strip()]


def table(runs: list[dict]) -> dict:
    """Per env: the latest code version's runs at the published budget, their mean and spread, and the verdicts."""
    out = {}
    for env, published in PUBLISHED.items():
        mine = [r for r in runs if r["env"] == env and r["budget"] == published.budget]
        if not mine:
            continue
        latest = {}
        for r in mine:   # one run per seed: the last recorded
            latest[r["seed"]] = r
        key = "greedy_mean_return" if published.greedy else "last_100_mean_return"
        if any(r.get(key) is None for r in latest.values()):
            continue
        returns = [r[key] for r in latest.values()]
        mean = statistics.fmean(returns)
        out[env] = {
            "preset": latest[next(iter(latest))]["preset"], "seeds": sorted(latest), "budget": published.budget,
            "mean": round(mean, 2), "std": round(statistics.pstdev(returns), 2) if len(returns) > 1 else None,
            "compared": "greedy evaluation, 50 episodes" if published.greedy else "last-100 training return",
            "per_seed": {s: round(r[key], 2) for s, r in sorted(latest.items())},
            "published": dataclasses.asdict(published), "reaches_published": mean >= published.mean,
            "warnings_or_worse": sum(r["verdict_counts"]["warning"] + r["verdict_counts"]["critical"]
                                     for r in latest.values()),
            "verdicts": sorted({f"{v['rule']} ({v['severity']})" for r in latest.values() for v in r["verdicts"]}),
            "env_steps_per_second": round(statistics.median(r["env_steps_per_second"] for r in latest.values())),
            "code_versions": sorted({r["code_version"] for r in latest.values()}),
        }
    return out


def markdown(rows: dict) -> str:
    lines = ["| env | preset | budget | seeds | rlvitals (mean ± std) | figure | published | source | verdicts |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for env, row in rows.items():
        mine = f"{row['mean']:,.1f}" + (f" ± {row['std']:,.1f}" if row["std"] is not None else "")
        pub = row["published"]
        lines.append(f"| {env} | {row['preset']} | {row['budget']:,} | {len(row['seeds'])} | {mine} | "
                     f"{row['compared']} | "
                     f"{pub['mean']:,.1f} ± {pub['std']:,.1f} | {pub['source']} | "
                     f"{', '.join(row['verdicts']) or 'none'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=list(PUBLISHED), choices=list(PUBLISHED), metavar="ENV")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=None, help="env steps per run (default: the published one)")
    parser.add_argument("--again", action="store_true", help="run seeds already recorded for this code version")
    parser.add_argument("--table", action="store_true", help="only write the table from the recorded runs")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    if not args.table:
        version = code_version()
        done = {(r["env"], r["seed"], r["budget"], r["code_version"]) for r in recorded()}
        for env in args.envs:
            budget = args.budget or PUBLISHED[env].budget
            for seed in args.seeds:
                if (env, seed, budget, version) in done and not args.again:
                    continue
                run = one_run(env, seed, budget)
                with RUNS.open("a") as f:
                    f.write(json.dumps(run) + "\n")
                print(f"{env} seed {seed}: last-100 return {run['last_100_mean_return']:,.1f}, greedy "
                      f"{run['greedy_mean_return']} "
                      f"(published {PUBLISHED[env].mean:,.1f}), {run['env_steps_per_second']:,.0f} env steps/s, "
                      f"verdicts {run['verdict_counts']}", flush=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import write_result

    rows = table(recorded())
    print(markdown(rows))
    print(write_result("baselines", {"published": {e: dataclasses.asdict(p) for e, p in PUBLISHED.items()},
                                     "runs_file": str(RUNS.relative_to(REPO))}, rows))


if __name__ == "__main__":
    main()
