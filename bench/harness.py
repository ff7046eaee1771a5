"""One entry point for the benchmark scenarios; each writes one JSON result.

Usage: python bench/harness.py SCENARIO [--env ID] [--repeats N] [--seconds S] [--modes local ray]
                                        [--num-envs N] [--rollout-length T] [--set FIELD=VALUE ...]
                                        [--threshold X] [--steps N] [--results-dir DIR]

Scenarios (see bench/README.md):
  env-limit          raw vector-env steps/s with random actions: no policy, no runner
  pipeline-ceiling   the actors and transport (local and/or Ray mode) with `--agent random`: no learning
  train-throughput   full PPO training, env steps/s
  telemetry-overhead throughput at each verbosity level against `off` (bench/telemetry_overhead.py)
  time-to-score      seconds to a last-100 mean return (CartPole-v1: 475), one seed per repeat

Throughput of a training run is its steady rate: env steps between the first and the last
metrics row over the seconds between them, so Ray start-up and the first update are left out.
The result goes to <results-dir>/<scenario>_<env>.json (default bench/results/).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np

from common import spread, write_result
from rlvitals.config import TrainConfig, coerce

SCENARIOS = ("env-limit", "pipeline-ceiling", "train-throughput", "telemetry-overhead", "time-to-score")
THRESHOLDS = {"CartPole-v1": 475.0, "ALE/Pong-v5": 18.0}
# Smaller batches for image envs: a [T+1, N, 4, 84, 84] uint8 rollout is 28 KB per sample.
ATARI_DEFAULTS = {"num_envs": 8, "rollout_length": 64, "num_minibatches": 4, "learning_rate": 2.5e-4}


def env_slug(env: str) -> str:
    return env.replace("/", "-").replace(":", "-")


def is_atari(env: str) -> bool:
    import gymnasium as gym

    from rlvitals.actors.atari import is_atari as spec_is_atari
    from rlvitals.actors.envs import resolve_env_id

    return spec_is_atari(gym.spec(resolve_env_id(env)))


def train_fields(args) -> dict:
    """TrainConfig fields of this benchmark: per-env defaults, then --num-envs/--rollout-length/--set."""
    fields = dict(ATARI_DEFAULTS) if is_atari(args.env) else {}
    if args.num_envs:
        fields["num_envs"] = args.num_envs
    if args.rollout_length:
        fields["rollout_length"] = args.rollout_length
    for item in args.set:
        name, _, raw = item.partition("=")
        fields[name] = coerce(name, raw)
    return fields


class Deadline:
    """A `stop` callable for the run loops: true `seconds` after its first call (the loop's start)."""

    def __init__(self, seconds: float):
        self.seconds, self.end = seconds, None

    def __call__(self) -> bool:
        now = time.perf_counter()
        if self.end is None:
            self.end = now + self.seconds
        return now >= self.end


def train_run(fields: dict, run_dir: str, seconds: float) -> dict:
    """One run in this process for at most `seconds` of its loop: summary plus steady-state steps/s."""
    from rlvitals.archive import RunArchive
    from rlvitals.training import train_local

    cfg = TrainConfig(**{"verbosity": "off", "progress": False,
                         "checkpoint_interval": 10**9, **fields, "run_dir": run_dir}).validate()
    archive = RunArchive.create(cfg.run_dir, cfg.to_dict(), ["bench"])
    try:
        if cfg.mode == "ray":
            from rlvitals.distributed import train_ray

            summary = train_ray(cfg, archive, stop=Deadline(seconds))
        else:
            summary = train_local(cfg, archive, stop=Deadline(seconds))
    finally:
        archive.close()
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    first, last = rows[0], rows[-1]
    span = last["wall_seconds"] - first["wall_seconds"]
    summary["steady_env_steps_per_second"] = (last["env_steps"] - first["env_steps"]) / span if span > 0 else None
    return summary


# ------------------------------------------------------------------------------------ scenarios
def env_limit(args) -> tuple[dict, dict]:
    from rlvitals.actors.envs import make_vector_env

    num_envs = train_fields(args).get("num_envs", TrainConfig.num_envs)
    rates = []
    for rep in range(args.repeats):
        env = make_vector_env(args.env, num_envs)
        try:
            env.reset(seed=rep)
            space = env.single_action_space
            rng = np.random.default_rng(rep)
            # A bank of batched random actions drawn up front: the loop below is env.step alone.
            if hasattr(space, "n"):
                bank = rng.integers(0, int(space.n), (1024, num_envs))
            else:
                bank = rng.uniform(space.low, space.high, (1024, num_envs, *space.shape)).astype(space.dtype)
            steps, t0 = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - t0) < args.seconds:
                for i in range(steps, steps + 64):
                    env.step(bank[i % len(bank)])
                steps += 64
        finally:
            env.close()
        rates.append(steps * num_envs / elapsed)
        print(f"repeat {rep}: {rates[-1]:,.0f} env steps/s ({num_envs} envs)", flush=True)
    figures = {"env_steps_per_second": spread(rates)}
    if is_atari(args.env):
        from rlvitals.actors.atari import FRAME_SKIP

        figures["frames_per_second"] = spread([r * FRAME_SKIP for r in rates])
    return {"num_envs": num_envs}, figures


def _throughput(args, agent: str) -> tuple[dict, dict]:
    fields = {**train_fields(args), "env": args.env, "agent": agent, "total_env_steps": 10**12}
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes:
            steady, overall = [], []
            for rep in range(args.repeats):
                s = train_run({**fields, "mode": mode, "seed": rep}, f"{tmp}/{mode}-{rep}", args.seconds)
                steady.append(s["steady_env_steps_per_second"])
                overall.append(s["env_steps_per_second"])
                print(f"{mode} repeat {rep}: {steady[-1] or 0:,.0f} env steps/s steady "
                      f"({overall[-1]:,.0f} overall, {s['env_steps']} steps)", flush=True)
            figures[mode] = {"env_steps_per_second": spread(steady),
                             "env_steps_per_second_with_startup": spread(overall)}
    return {**fields, "modes": args.modes, "seconds": args.seconds}, figures


def pipeline_ceiling(args):
    return _throughput(args, "random")


def train_throughput(args):
    return _throughput(args, "ppo")


def telemetry_overhead(args) -> tuple[dict, dict]:
    import telemetry_overhead as overhead

    fields = train_fields(args)
    steps = args.steps or (2048 if is_atari(args.env) else 100_000)
    figures = overhead.measure(args.repeats, steps, args.env, fields)
    for level, loss in figures["throughput_loss_vs_off"].items():
        print(f"{level:8s} throughput loss vs off: {100 * loss:+.2f}%")
    return {"env": args.env, "mode": "local", "steps": steps, **fields}, figures


def time_to_score(args) -> tuple[dict, dict]:
    threshold = args.threshold if args.threshold is not None else THRESHOLDS.get(args.env)
    if threshold is None:
        raise SystemExit(f"--threshold is needed for env={args.env!r} (known: {', '.join(THRESHOLDS)})")
    fields = {**train_fields(args), "env": args.env, "return_threshold": threshold, "stop_at_threshold": True}
    if args.steps:
        fields["total_env_steps"] = args.steps
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.repeats):
            s = train_run({**fields, "seed": seed}, f"{tmp}/s{seed}", args.seconds)
            runs.append(s)
            print(f"seed {seed}: {s['seconds_to_threshold']} s to {threshold:g} ({s['env_steps_to_threshold']} "
                  f"steps); mean return {s['mean_return_last_100']}, {s['env_steps']} steps in "
                  f"{s['wall_seconds']:.0f} s", flush=True)
    figures = {
        "seconds_to_threshold": spread([r["seconds_to_threshold"] for r in runs]),
        "env_steps_to_threshold": spread([r["env_steps_to_threshold"] for r in runs]),
        "env_steps_per_second": spread([r["env_steps_per_second"] for r in runs]),
        "solved_runs": sum(r["seconds_to_threshold"] is not None for r in runs),
        "per_seed": [{"seed": i, **{k: r[k] for k in ("seconds_to_threshold", "env_steps_to_threshold", "env_steps",
                                                      "episodes", "wall_seconds", "mean_return_last_100")}}
                     for i, r in enumerate(runs)],
    }
    return {**fields, "budget_seconds": args.seconds}, figures


RUNNERS = {"env-limit": env_limit, "pipeline-ceiling": pipeline_ceiling, "train-throughput": train_throughput,
           "telemetry-overhead": telemetry_overhead, "time-to-score": time_to_score}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenario", choices=SCENARIOS)
    p.add_argument("--env", default="CartPole-v1", help="env id (default CartPole-v1)")
    p.add_argument("--repeats", type=int, default=3, help="repeats (seeds for time-to-score); default 3")
    p.add_argument("--seconds", type=float, default=10.0,
                   help="seconds per repeat (time-to-score: the budget per seed); default 10")
    p.add_argument("--modes", nargs="+", choices=("local", "ray"), default=None,
                   help="run loops for pipeline-ceiling/train-throughput; default local and ray, local")
    p.add_argument("--num-envs", type=int, default=0, help="envs per actor (default: the env's benchmark default)")
    p.add_argument("--rollout-length", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="any other TrainConfig field, e.g. --set image_network=impala (repeatable)")
    p.add_argument("--threshold", type=float, default=None, help="time-to-score return threshold")
    p.add_argument("--steps", type=int, default=0,
                   help="telemetry-overhead: env steps per run; time-to-score: total_env_steps")
    p.add_argument("--results-dir", default=None, help="folder of the JSON result (default bench/results/)")
    return p


def main(argv: list[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    if args.modes is None:
        args.modes = ["local", "ray"] if args.scenario == "pipeline-ceiling" else ["local"]
    config, figures = RUNNERS[args.scenario](args)
    config = {"scenario_args": {k: v for k, v in vars(args).items() if k != "results_dir"}, **config}
    path = write_result(args.scenario, config, figures, name=f"{args.scenario}_{env_slug(args.env)}",
                        results_dir=args.results_dir)
    print(path)
    return path


if __name__ == "__main__":
    main()
