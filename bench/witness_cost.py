"""The env-output witness's cost, timed directly: seconds inside its own code against the collection's.

The witness (actors/witness.py) wraps the vector env the runner steps. Each
of its calls (step, begin, take) is timed, and so is each call it makes into
the env it wraps; its own time is the difference, summed over a collection,
and its share is that sum over the same `EnvRunner.collect`'s time, in the
same run (perf_counter on both sides, so a pre-emption lands on each in
proportion). The timers' own cost is measured the same way on a runner
whose env slot is the bare vector env under the same timers (`floor`),
alternating with the witnessed collections; the share is the median over
collections, reported raw (an upper bound: it includes the timers) and net
of the floor's median. A whole-collection A/B cannot show an effect this size on a
shared machine (it read +2..9%, noise); this can.

Usage: python bench/witness_cost.py [--envs CartPole-v1 Pendulum-v1 Acrobot-v1] [--rounds 40] [--out ...]
Target (issue 20): under 2% of collection time at `standard`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

TARGET = 0.02


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


class Stopwatch:
    """Seconds in the timed calls (`outer`) and in the calls they make into the wrapped env (`inner`)."""

    def __init__(self):
        self.seconds = {"outer": 0.0, "inner": 0.0}

    def timed(self, fn, slot: str):
        clock, seconds = time.perf_counter, self.seconds

        def call(*args, **kwargs):
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[slot] += clock() - start
        return call

    def instrument(self, slot_env, inner_env) -> None:
        """Time slot_env's calls the runner makes and inner_env's that slot_env makes (instance attributes)."""
        for name in ("step", "reset"):
            setattr(inner_env, name, self.timed(getattr(inner_env, name), "inner"))
        for name in ("step", "begin", "take"):
            setattr(slot_env, name, self.timed(getattr(slot_env, name), "outer"))

    def take(self) -> float:
        """Own seconds since the last take (outer less inner), and start again."""
        own = self.seconds["outer"] - self.seconds["inner"]
        self.seconds.update(outer=0.0, inner=0.0)
        return own


def measure(env_id: str, rounds: int) -> dict:
    import torch

    from rlvitals.actors.runner import EnvRunner
    from rlvitals.config import TrainConfig
    from rlvitals.training import make_network, seed_everything

    cfg = TrainConfig(env=env_id).validate()
    seed_everything(0, 1)
    runner = EnvRunner(cfg.env, cfg.num_envs, 0)
    net = make_network(cfg, runner.obs_space, runner.action_space)
    witness, watch = runner.witness, Stopwatch()
    # The floor's slot calls the timed env's step straight from its own timer: what it reads is the timers alone.
    slots = {"witness": witness, "floor": _Unwitnessed(witness.env)}
    watch.instrument(witness, witness.env)
    for name in ("step", "begin", "take"):
        setattr(slots["floor"], name, watch.timed(getattr(slots["floor"], name), "outer"))

    def collect(kind: str) -> tuple[float, float]:
        runner.env = runner.witness = slots[kind]
        start = time.perf_counter()
        runner.collect(net, cfg.rollout_length)
        total = time.perf_counter() - start
        return watch.take(), total

    with torch.no_grad():
        for _ in range(2):   # warm-up: first-call allocations, torch's lazy init
            collect("witness"), collect("floor")
        runs = {"witness": [], "floor": []}
        for _ in range(rounds):   # alternated, so drift in the machine's load falls on both alike
            runs["witness"].append(collect("witness"))
            runs["floor"].append(collect("floor"))
    runner.env = runner.witness = witness
    runner.close()

    def shares(kind: str) -> list[float]:
        return [own / total for own, total in runs[kind]]

    def per_step_us(kind: str, part: int) -> float:
        return 1e6 * statistics.median(run[part] for run in runs[kind]) / cfg.rollout_length

    w, f = shares("witness"), shares("floor")
    own_s, collect_s = (sum(run[i] for run in runs["witness"]) for i in (0, 1))
    net = statistics.median(w) - statistics.median(f)
    return {"env": env_id, "num_envs": cfg.num_envs, "rollout_length": cfg.rollout_length, "collections": rounds,
            # Medians over collections: a pre-emption landing inside the witness's few microseconds inflates
            # one collection's share many times; the pooled ratio is kept for comparison.
            "share_of_collection": {"median_net_of_timers": net, "median_raw": statistics.median(w),
                                    "raw_quartiles": statistics.quantiles(w, n=4),
                                    "timers_floor_quartiles": statistics.quantiles(f, n=4),
                                    "pooled_raw": own_s / collect_s},
            "median_us_per_vector_step": {"witness_own": per_step_us("witness", 0),
                                          "timers_floor": per_step_us("floor", 0),
                                          "collection": per_step_us("witness", 1)},
            "within_target": net < TARGET}


def main(argv: list[str] | None = None) -> Path:
    import torch

    from common import machine_info

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", nargs="+", default=["CartPole-v1", "Pendulum-v1", "Acrobot-v1"])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--out", default=str(BENCH / "results" / "witness_cost.json"))
    args = p.parse_args(argv)
    if args.rounds < 4:
        p.error(f"--rounds {args.rounds}: need at least 4 (quartiles)")

    torch.set_num_threads(1)
    results = [measure(env_id, args.rounds) for env_id in args.envs]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "scenario": "witness-cost", "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "target_share": TARGET,
        "method": "perf_counter inside the witness's own calls (less the wrapped env's) over the same collect's; "
                  "floor = the same timers around the bare vector env",
        "envs": results, "load_average": os.getloadavg(), "machine": machine_info(),
        "command": " ".join(["python", "bench/witness_cost.py", *(argv if argv is not None else sys.argv[1:])])},
        indent=1) + "\n")
    for r in results:
        share, us = r["share_of_collection"], r["median_us_per_vector_step"]
        print(f"{r['env']}: witness {us['witness_own']:.1f} us of a {us['collection']:.0f} us vector step "
              f"(medians): {share['median_raw']:.2%} of collection raw, {share['median_net_of_timers']:.2%} net "
              f"of the timers' {us['timers_floor']:.1f} us (target < {TARGET:.0%}; pooled raw "
              f"{share['pooled_raw']:.2%})")
    return out


if __name__ == "__main__":
    main()
