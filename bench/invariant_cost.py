"""What the learner's invariant checks cost: their time inside real updates against the updates themselves.

A real local run (`train_in`, default settings) whose learner has every hook of
`LearnerInvariants` (arrival, first minibatch, clip, each step, report) and the
optimizer-step counter wrapped in a timer, and `PPOLearner.learn` timed as a
whole. The expensive checks run on "sampled" updates (the first 16, then every
8th); the rest pay only the cheap ones. So it reports both kinds apart and the
long-run share: (one sampled + seven unsampled) over eight updates' time;
and the checks' share of the whole run (collection, learning, telemetry) of
`--updates` updates, where the sampled first 16 weigh more than in a long run.
Timed directly, on the same updates, rather than as a throughput ratio: on this
shared 2-core machine whole-run throughput varies by more than the effect.

Usage: python bench/invariant_cost.py [--env CartPole-v1] [--updates 64]
Target (issue 20): inside the telemetry budget, under 2% of training at `standard`.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result
from rlvitals.config import TrainConfig
from rlvitals.learner.invariants import LearnerInvariants, is_sampled
from rlvitals.learner.ppo import PPOLearner
from rlvitals.session import train_in

HOOKS = ("arrival", "before_backward", "first_minibatch", "clipped", "step", "report")


def measure(env: str, updates: int, overrides: dict) -> dict:
    in_checks: list[float] = []     # seconds in the hooks during the update being learned
    per_update: list[tuple[int, float, float]] = []   # (update index, learn seconds, hook seconds)

    def timed_hook(original):
        @functools.wraps(original)
        def hook(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                in_checks[-1] += time.perf_counter() - t0
        return hook

    def timed_learn(original):
        @functools.wraps(original)
        def learn(self, rollout):
            in_checks.append(0.0)
            t0 = time.perf_counter()
            out = original(self, rollout)
            per_update.append((self.updates - 1, time.perf_counter() - t0, in_checks[-1]))
            return out
        return learn

    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory(prefix="bench-invariants-") as tmp:
        for name in HOOKS:
            mp.setattr(LearnerInvariants, name, timed_hook(getattr(LearnerInvariants, name)))
        mp.setattr(PPOLearner, "learn", timed_learn(PPOLearner.learn))
        cfg = TrainConfig(env=env, progress=False, device="cpu", run_dir=str(Path(tmp) / "run"), **overrides)
        cfg.total_env_steps = cfg.num_envs * cfg.rollout_length * updates
        t0 = time.perf_counter()
        train_in(cfg.validate(), ["bench"])
        run_seconds = time.perf_counter() - t0

    def share(rows):
        return sum(h for _, _, h in rows) / sum(t for _, t, _ in rows) if rows else None

    sampled = [r for r in per_update[1:] if is_sampled(r[0])]     # the first update also builds everything
    unsampled = [r for r in per_update[1:] if not is_sampled(r[0])]
    mean = lambda rows, i: statistics.fmean(r[i] for r in rows) if rows else None  # noqa: E731
    long_run = None
    if sampled and unsampled:
        long_run = ((mean(sampled, 2) + 7 * mean(unsampled, 2)) / (mean(sampled, 1) + 7 * mean(unsampled, 1)))
    return {"updates_timed": len(per_update) - 1, "sampled_updates": len(sampled), "unsampled_updates": len(unsampled),
            "learn_seconds_sampled": mean(sampled, 1), "learn_seconds_unsampled": mean(unsampled, 1),
            "checks_seconds_sampled": mean(sampled, 2), "checks_seconds_unsampled": mean(unsampled, 2),
            "share_of_update_sampled": share(sampled), "share_of_update_unsampled": share(unsampled),
            "share_long_run": long_run, "run_seconds": run_seconds,
            "learn_share_of_run": sum(t for _, t, _ in per_update) / run_seconds,
            "share_of_training": sum(h for _, _, h in per_update) / run_seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", default="CartPole-v1,Pendulum-v1")
    p.add_argument("--updates", type=int, default=64)
    args = p.parse_args()
    settings = {"Pendulum-v1": {"num_envs": 16, "rollout_length": 256, "gamma": 0.9, "learning_rate": 3e-4}}
    figures = {}
    for env in args.envs.split(","):
        figures[env] = measure(env, args.updates, settings.get(env, {}))
        f = figures[env]
        print(f"{env}: checks {100 * f['share_of_update_sampled']:.2f}% of a sampled update, "
              f"{100 * f['share_of_update_unsampled']:.2f}% of another, {100 * f['share_long_run']:.2f}% of "
              f"updates in the long run; {100 * f['share_of_training']:.2f}% of this run's {f['run_seconds']:.0f} s "
              f"(learning {100 * f['learn_share_of_run']:.0f}% of it)", flush=True)
    path = write_result("invariant_cost", {"envs": args.envs, "updates": args.updates, "settings": settings},
                        figures, name="invariant_cost")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
