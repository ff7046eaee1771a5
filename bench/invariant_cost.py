"""What the checks and telemetry cost at `standard`: their time inside one real run against the run's.

A real local run (`train_in`, default settings, verbosity `standard`, its metrics served) with every part
that only watches it timed where it runs:
- learner checks: the invariant hooks (`LearnerInvariants`) and the minibatch step's cost reference;
- learner telemetry: the running step statistics (`StepSums`), the batch's statistics (value, target,
  advantage and reward distributions, scales, consistency, the behaviour record), the update's step
  statistics and the statistics' one host transfer;
- actor checks: the env-output witness's own time (its calls less those it makes into the env it wraps;
  the timers of bench/witness_cost.py), the forward-pass and env-step cost references, the weights'
  fingerprints, the check that the actor acted with its network;
- loop checks: the pipeline evidence and the weights handed out and checked;
- the run loop's `invariants` (boundary, streams, episodes, judging), `telemetry` (the recorder, the exporter
  check) and `rows` (health rules, verdicts, the archive's rows) phases, as the run itself times them.
A timed call inside another timed call counts once. Each part is reported as a share of the run's wall time
over the whole run, and over its steady part: from the update where the first SAMPLED_FIRST updates' dense
checking ends (every check is then at its long-run rate: one sampled update in SAMPLED_EVERY) to the last
update. The steady figure is the one against the target: a run of the default budget is mostly steady.
Timed directly rather than as a throughput ratio: on this shared 2-core machine whole-run throughput varies by
more than the effect.

Usage: python bench/invariant_cost.py [--envs CartPole-v1,Pendulum-v1] [--updates 64]
Target (issues 20, 31): all checks and telemetry under 2% of training at `standard`.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from witness_cost import Stopwatch

from common import write_result
from rlvitals.actors.acting_check import ActingCheck
from rlvitals.actors.env_step_cost import EnvStepCost
from rlvitals.actors.inference_cost import ForwardCost
from rlvitals.actors.runner import EnvRunner
from rlvitals.config import TrainConfig
from rlvitals.evidence import PipelineEvidence
from rlvitals.learner import diagnostics, ppo
from rlvitals.learner.invariants import SAMPLED_FIRST, LearnerInvariants
from rlvitals.learner.minibatch_cost import MinibatchCost
from rlvitals.learner.networks import ActorCritic
from rlvitals.learner.ppo import PPOLearner
from rlvitals.learner.step_sums import StepSums
from rlvitals.run import Run
from rlvitals.session import train_in
from rlvitals.telemetry.recorder import Recorder

TIMED = {
    "learner_checks": [(LearnerInvariants, n) for n in ("received", "stamp", "before_scaling", "arrival",
                                                         "before_backward",
                                                         "first_minibatch", "clipped", "stepped", "step", "report")]
    + [(MinibatchCost, "measure")],
    "learner_telemetry": [(StepSums, n) for n in ("gradients", "add", "kl_step", "result")]
    + [(PPOLearner, n) for n in ("_batch_stats", "_scale_stats", "_consistency")]
    + [(diagnostics, "record_discrepancy"), (diagnostics, "step_statistics"), (ppo, "to_host")],
    "actor_checks": [(ForwardCost, "measure"), (EnvStepCost, "measure"), (ActorCritic, "weights_checksum"),
                     (ActingCheck, "measure")],
    "loop_checks": [(PipelineEvidence, "learned"), (Run, "weights_handed_out"), (Run, "weights_mismatch")],
}
"""Each part's timed callables: (owner, attribute), patched for the run."""
LOOP_PHASES = ("invariants", "telemetry", "rows")
"""The run loop's phases that only watch: without telemetry and checks, none of them would run."""
TARGET = 0.02


class Ledger:
    """Seconds per part, each stamped with when it ended; one timed call inside another counts once."""

    def __init__(self):
        self.entries: list[tuple[float, str, float]] = []
        self.depth = 0

    def timed(self, part: str, original, name: str):
        @functools.wraps(original)
        def call(*args, **kwargs):
            self.depth += 1
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    end = time.perf_counter()
                    self.entries.append((end, part, end - start))
                    self.entries.append((end, name, end - start))
        return call

    def add(self, part: str, seconds: float) -> None:
        self.entries.append((time.perf_counter(), part, seconds))

    def shares(self, since: float, until: float) -> tuple[dict[str, float], dict[str, float]]:
        """(share per part, share per timed callable) of the wall time from `since` to `until`."""
        totals: dict[str, float] = defaultdict(float)
        for at, key, seconds in self.entries:
            if since <= at <= until:
                totals[key] += seconds
        parts = [*TIMED, "witness", *(f"loop_{p}" for p in LOOP_PHASES)]
        share = {key: seconds / (until - since) for key, seconds in totals.items()}
        return ({p: share.get(p, 0.0) for p in parts},
                dict(sorted(((k, v) for k, v in share.items() if k not in parts), key=lambda kv: -kv[1])))


def measure(env: str, updates: int, overrides: dict) -> dict:
    ledger = Ledger()
    watches: list[Stopwatch] = []
    marks: dict[str, float] = {}

    def take_witness() -> None:
        ledger.add("witness", sum(w.take() for w in watches))

    def marked_learn(original):
        @functools.wraps(original)
        def learn(self, rollout):
            if self.updates == SAMPLED_FIRST:   # the steady part begins: what the witness did before is before
                take_witness()
                marks["steady"] = time.perf_counter()
            return original(self, rollout)
        return learn

    def marked_step(original):
        @functools.wraps(original)
        def learn_step(self, rollout):
            out = original(self, rollout)
            take_witness()
            marks["last"] = time.perf_counter()
            return out
        return learn_step

    def counted_phase(original):
        @functools.wraps(original)
        def record_phase(self, phase, seconds):
            if phase in LOOP_PHASES:
                ledger.add(f"loop_{phase}", seconds)
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
        for part, targets in TIMED.items():
            for owner, name in targets:
                label = f"{getattr(owner, '__name__', owner)}.{name}".rsplit(".", 2)[-2:]
                mp.setattr(owner, name, ledger.timed(part, getattr(owner, name), ".".join(label)))
        mp.setattr(PPOLearner, "learn", marked_learn(PPOLearner.learn))
        mp.setattr(Run, "learn_step", marked_step(Run.learn_step))
        mp.setattr(Recorder, "record_phase", counted_phase(Recorder.record_phase))
        mp.setattr(EnvRunner, "__init__", watched_runner(EnvRunner.__init__))
        cfg = TrainConfig(env=env, progress=False, device="cpu", verbosity="standard", run_dir=str(Path(tmp) / "run"),
                          **overrides)
        cfg.total_env_steps = cfg.num_envs * cfg.rollout_length * updates
        t0 = time.perf_counter()
        train_in(cfg.validate(), ["bench"], serve_metrics=True)   # telemetry as `rlvitals train` starts it
        run_seconds = time.perf_counter() - t0
    whole, _ = ledger.shares(t0, t0 + run_seconds)
    steady, callables = ledger.shares(marks["steady"], marks["last"])
    return {"updates": updates, "steady_from_update": SAMPLED_FIRST, "run_seconds": run_seconds,
            "steady_seconds": marks["last"] - marks["steady"],
            "parts_share_of_run": whole, "parts_share_steady": steady, "callables_share_steady": callables,
            "telemetry_share_of_run": sum(whole.values()), "telemetry_share_steady": sum(steady.values()),
            "within_target": sum(steady.values()) < TARGET}


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
        parts = ", ".join(f"{name} {100 * v:.2f}%" for name, v in f["parts_share_steady"].items())
        print(f"{env}: from update {f['steady_from_update']} to the last ({f['steady_seconds']:.0f} s of "
              f"{f['run_seconds']:.0f} s): {parts}; together {100 * f['telemetry_share_steady']:.2f}% "
              f"(the whole run: {100 * f['telemetry_share_of_run']:.2f}%)", flush=True)
    path = write_result("invariant_cost", {"envs": args.envs, "updates": args.updates, "settings": settings,
                                           "sampled_first": SAMPLED_FIRST}, figures, name="invariant_cost")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
