"""What the checks and telemetry cost at `standard`: their time inside one real run against the run's.

A real local run (`train_in`, default settings, verbosity `standard`, its metrics served) with every
part that watches it timed where it runs, on the same updates:
- the learner's invariant hooks (`LearnerInvariants`: arrival, first minibatch,
  clip, each step, report) against `PPOLearner.learn`, split into "sampled"
  updates (the first 16, then one in SAMPLED_EVERY), where the expensive checks
  run, and the others; the long-run share weighs one sampled update against
  SAMPLED_EVERY - 1 others;
- the env-output witness's own time (its calls less those it makes into the env
  it wraps; the timers of bench/witness_cost.py);
- the run loop's `invariants` (boundary, streams, episodes, judging), `telemetry`
  (the recorder) and `rows` (the health rules, verdicts and the archive's rows)
  phases, as the run itself times them.
Each is reported as a share of the run's wall time, and their sum as the
telemetry budget's figure. The run's first `SAMPLED_FIRST` updates are all
sampled, so a short run spends more in them than a long one; `long_run_share`
replaces the hooks' figure of this run with their long-run share of learning.
Timed directly, rather than as a throughput ratio: on this shared 2-core
machine whole-run throughput varies by more than the effect.

Usage: python bench/invariant_cost.py [--envs CartPole-v1,Pendulum-v1] [--updates 64]
Target (issue 20): inside the telemetry budget, under 2% of training at `standard`.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from witness_cost import Stopwatch

from common import write_result
from rlvitals.actors.runner import EnvRunner
from rlvitals.config import TrainConfig
from rlvitals.learner.invariants import SAMPLED_EVERY, LearnerInvariants, is_sampled
from rlvitals.learner.ppo import PPOLearner
from rlvitals.session import train_in
from rlvitals.telemetry.recorder import Recorder

HOOKS = ("arrival", "before_backward", "first_minibatch", "clipped", "step", "report")
LOOP_PHASES = ("invariants", "telemetry", "rows")
"""The run loop's phases that only watch: without telemetry and checks, none of them would run."""
TARGET = 0.02


def measure(env: str, updates: int, overrides: dict) -> dict:
    in_checks: list[float] = []     # seconds in the hooks during the update being learned
    per_update: list[tuple[int, float, float]] = []   # (update index, learn seconds, hook seconds)
    phases: dict[str, float] = defaultdict(float)
    watches: list[Stopwatch] = []

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

    def counted_phase(original):
        @functools.wraps(original)
        def record_phase(self, phase, seconds):
            phases[phase] += seconds
            return original(self, phase, seconds)
        return record_phase

    def watched_runner(original):
        @functools.wraps(original)
        def init(self, *args, **kwargs):
            original(self, *args, **kwargs)
            watches.append(Stopwatch())
            watches[-1].instrument(self.witness, self.witness.env)
        return init

    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory(prefix="bench-invariants-") as tmp:
        for name in HOOKS:
            mp.setattr(LearnerInvariants, name, timed_hook(getattr(LearnerInvariants, name)))
        mp.setattr(PPOLearner, "learn", timed_learn(PPOLearner.learn))
        mp.setattr(Recorder, "record_phase", counted_phase(Recorder.record_phase))
        mp.setattr(EnvRunner, "__init__", watched_runner(EnvRunner.__init__))
        cfg = TrainConfig(env=env, progress=False, device="cpu", verbosity="standard", run_dir=str(Path(tmp) / "run"),
                          **overrides)
        cfg.total_env_steps = cfg.num_envs * cfg.rollout_length * updates
        t0 = time.perf_counter()
        train_in(cfg.validate(), ["bench"], serve_metrics=True)   # telemetry as `rlvitals train` starts it
        run_seconds = time.perf_counter() - t0

    def share(rows):
        return sum(h for _, _, h in rows) / sum(t for _, t, _ in rows) if rows else None

    sampled = [r for r in per_update[1:] if is_sampled(r[0])]     # the first update also builds everything
    unsampled = [r for r in per_update[1:] if not is_sampled(r[0])]
    mean = lambda rows, i: statistics.fmean(r[i] for r in rows) if rows else None  # noqa: E731
    long_run = None
    if sampled and unsampled:
        rest = SAMPLED_EVERY - 1
        long_run = ((mean(sampled, 2) + rest * mean(unsampled, 2)) / (mean(sampled, 1) + rest * mean(unsampled, 1)))
    learn_share = sum(t for _, t, _ in per_update) / run_seconds
    parts = {"learner_checks": sum(h for _, _, h in per_update) / run_seconds,
             "witness": sum(w.take() for w in watches) / run_seconds,
             **{f"loop_{p}": phases[p] / run_seconds for p in LOOP_PHASES}}
    total = sum(parts.values())
    long_run_total = total - parts["learner_checks"] + (long_run * learn_share if long_run is not None else 0.0)
    return {"updates_timed": len(per_update) - 1, "sampled_updates": len(sampled), "unsampled_updates": len(unsampled),
            "learn_seconds_sampled": mean(sampled, 1), "learn_seconds_unsampled": mean(unsampled, 1),
            "checks_seconds_sampled": mean(sampled, 2), "checks_seconds_unsampled": mean(unsampled, 2),
            "share_of_update_sampled": share(sampled), "share_of_update_unsampled": share(unsampled),
            "share_long_run": long_run, "run_seconds": run_seconds, "learn_share_of_run": learn_share,
            "share_of_training": parts["learner_checks"],
            "parts_share_of_run": parts, "telemetry_share_of_run": total,
            "telemetry_share_long_run": long_run_total, "within_target": long_run_total < TARGET}


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
        parts = ", ".join(f"{name} {100 * v:.2f}%" for name, v in f["parts_share_of_run"].items())
        print(f"{env}: learner checks {100 * f['share_of_update_sampled']:.2f}% of a sampled update, "
              f"{100 * f['share_of_update_unsampled']:.2f}% of another, {100 * f['share_long_run']:.2f}% of "
              f"updates in the long run (learning is {100 * f['learn_share_of_run']:.0f}% of the run).\n"
              f"  Of this run's {f['run_seconds']:.0f} s: {parts}; together {100 * f['telemetry_share_of_run']:.2f}%,"
              f" {100 * f['telemetry_share_long_run']:.2f}% with the hooks' long-run share", flush=True)
    path = write_result("invariant_cost", {"envs": args.envs, "updates": args.updates, "settings": settings,
                                           "sampled_every": SAMPLED_EVERY}, figures, name="invariant_cost")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
