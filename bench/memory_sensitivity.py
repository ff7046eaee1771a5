"""Is an actor that keeps every rollout it made named within a 1M-step Ray run with two actors, and does a healthy
Ray run of the same length stay quiet (issue 31)?

Usage: python bench/memory_sensitivity.py [--steps N] [--bug NAME] [--healthy] [--out PATH]

Runs tests/diagnose.diagnose in Ray mode (two actors, CartPole-v1) for `--steps` env steps: with the planted bug
(tests/planted_cost_bugs.ray_actor_keeps_every_rollout by default) it stops at the first warning-or-worse verdict;
`--healthy` runs the same without a bug, never stopped early. Records the first verdict (rule, component, update,
env steps then), the largest memory_per_sample statistic seen and its naming text, every loud verdict, and each
actor incarnation's memory in use against the samples it delivered (from the counters on its rollouts): its growth
over the later half of the run, in MiB and in bytes per sample, and in each quarter of that half.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent / "tests")]

RAY_TWO_ACTORS = {"mode": "ray", "num_actors": 2, "torch_threads": 1}


def per_actor_growth(points: dict) -> dict:
    """Each incarnation's memory growth over the later half of its (samples, bytes in use) points."""
    out = {}
    for (actor, pid), p in points.items():
        (s0, m0), (s1, m1), (s2, m2) = p[len(p) // 2], p[3 * len(p) // 4], p[-1]
        out[f"actor {actor} (pid {pid})"] = {
            "rollouts": len(p), "start_mib": round(p[0][1] / 2**20, 1), "end_mib": round(m2 / 2**20, 1),
            "later_half_growth_mib": round((m2 - m0) / 2**20, 2),
            "later_half_bytes_per_sample": round((m2 - m0) / max(s2 - s0, 1), 2),
            "quarters_bytes_per_sample": [round((m1 - m0) / max(s1 - s0, 1), 2), round((m2 - m1) / max(s2 - s1, 1), 2)]}
    return out


def measure(steps: int, bug_name: str | None, budget_s: float) -> dict:
    import pytest
    from diagnose import LOUD, diagnose
    from planted_bugs import BY_BUG

    from rlvitals.distributed import accounting
    from rlvitals.telemetry.invariants import BY_NAME

    NAMED = BY_NAME["memory_per_sample"].names_key
    bug = BY_BUG[bug_name] if bug_name else None
    points: dict = {}
    arrived = accounting.ActorAccounts.arrived

    def note(self, rollout):   # the driver's view of each actor's own counters, as the judge gets them
        for c in rollout.actor_counters:
            points.setdefault((c["actor"], c["pid"]), []).append((c["samples"], c["memory"]))
        return arrived(self, rollout)

    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setattr(accounting.ActorAccounts, "arrived", note)
        t0 = time.perf_counter()
        found = diagnose(Path(tmp) / "run", bug=bug, budget_s=budget_s, stop_on_verdict=bug is not None,
                         total_env_steps=steps, **RAY_TWO_ACTORS)
        wall = time.perf_counter() - t0
    first = found.first
    at = {r["updates"]: r for r in found.rows}
    stats = [(r.get("inv_memory_per_sample"), r.get(NAMED), r["env_steps"]) for r in found.rows
             if r.get("inv_memory_per_sample") is not None]
    worst = max(stats, key=lambda s: s[0], default=(None, None, None))
    return {"bug": bug_name, "steps_asked": steps, "env_steps": found.summary.get("env_steps"),
            "updates": found.summary.get("updates"), "wall_s": round(wall, 1),
            "first": None if first is None else {
                "rule": first.rule, "component": first.component, "update": first.first_update,
                "env_steps": at.get(first.first_update, {}).get("env_steps"), "message": first.message},
            "loud": [v.to_dict() for v in found.verdicts if v.severity in LOUD],
            "max_memory_per_sample": worst[0], "max_at_env_steps": worst[2], "max_named": worst[1],
            "memory_per_sample_last": stats[-1][0] if stats else None, "per_actor": per_actor_growth(points)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--bug", default="ray_actor_keeps_every_rollout")
    p.add_argument("--healthy", action="store_true", help="no bug: a healthy run of the same length")
    p.add_argument("--budget", type=float, default=3600.0)
    p.add_argument("--out", default=str(BENCH / "results" / "memory_sensitivity.json"))
    args = p.parse_args(argv)
    from common import machine_info

    result = measure(args.steps, None if args.healthy else args.bug, args.budget)
    payload = {"scenario": "memory_sensitivity", "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "command": " ".join(["python", "bench/memory_sensitivity.py", *(argv or sys.argv[1:])]),
               "config": RAY_TWO_ACTORS, "machine": machine_info(), "result": result}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
