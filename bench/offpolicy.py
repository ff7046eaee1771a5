"""Off-policy advantage before and after issue 16: learning curves in Ray mode with stale batches.

Usage: python bench/offpolicy.py [--seeds 0 1 2] [--seconds 60] [--steps 200000] [--actors 2]
                                 [--in-flight 4] [--results-dir DIR]

CartPole-v1, `--mode ray` with 2 actors and several rollouts in flight per actor, so a
batch arrives several learner updates after the network that collected it. Recorded
per batch: its staleness, the mean |log pi/mu|, and how far the other formula's
advantages lie from the ones used, relative to their spread. Each seed runs twice in
fresh processes, interleaved: `before`, the advantage as it was,
delta_s + gamma c_s (v_{s+1} - V(x_{s+1})), patched into the learner by this script
only; `after`, the product's delta_s + gamma lam (v_{s+1} - V(x_{s+1})). Targets are
the same in both. On a loaded machine give runs more time (`--seconds 150`).
Writes bench/results/offpolicy.json: per variant the curve of the last-100 mean
return against env steps (and its median over seeds where every seed got that far:
a run also stops at its deadline), env steps to 475 and the final return, per seed
and as min/median/max.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import spread, write_result

VARIANTS = ("before", "after")
GRID = 20_000   # env steps between points of the reported curve


def _vtrace_before_issue_16(values, next_values, rewards, terminated, done, log_rhos, gamma, lam,
                            rho_clip=1.0, c_clip=1.0, valid=None):
    """The formula replaced by issue 16: the advantage's trace cut by the step's own c_s."""
    import torch

    from rlvitals.learner.returns import _masks

    not_terminal, carry, live = _masks(terminated, done, valid, rewards.dtype)
    rhos = log_rhos.exp()
    clipped_rho, cs = rhos.clamp(max=rho_clip), lam * rhos.clamp(max=c_clip)
    deltas = (rewards + gamma * not_terminal * next_values - values) * live
    corrections, advantages = torch.zeros_like(rewards), torch.zeros_like(rewards)
    acc = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        carried = gamma * cs[t] * carry[t] * acc
        advantages[t] = deltas[t] + carried
        acc = clipped_rho[t] * deltas[t] + carried
        corrections[t] = acc
    return values + corrections, advantages


def _recording(chosen, gaps: list):
    """`chosen` vtrace, noting per batch how far the other formula's advantages lie from it:
    mean |A_before - A_after| over valid steps, relative to the std of the advantages used."""
    from rlvitals.learner.returns import vtrace as after

    other = after if chosen is _vtrace_before_issue_16 else _vtrace_before_issue_16

    def vtrace(values, next_values, rewards, terminated, done, log_rhos, gamma, lam, rho_clip=1.0, c_clip=1.0,
               valid=None):
        args = (values, next_values, rewards, terminated, done, log_rhos, gamma, lam, rho_clip, c_clip)
        targets, advantages = chosen(*args, valid=valid)
        m = valid if valid is not None else advantages == advantages
        gap = (advantages - other(*args, valid=valid)[1]).abs()[m]
        gaps.append([(gap.mean() / advantages[m].std()).item(), log_rhos[m].abs().mean().item()])
        return targets, advantages

    return vtrace


def fields(args, seed: int) -> dict:
    return {"env": "CartPole-v1", "mode": "ray", "num_actors": args.actors,
            "rollouts_in_flight": args.in_flight, "seed": seed, "total_env_steps": args.steps,
            "device": "cpu", "verbosity": "off", "progress": False,
            "checkpoint_interval": 10**9}


def one_run(variant: str, seed: int, args, out: str) -> None:
    """Child process: one training run; writes its summary and metric rows to `out`."""
    from harness import Deadline

    import rlvitals.learner.ppo as ppo
    from rlvitals.archive import RunArchive
    from rlvitals.config import TrainConfig
    from rlvitals.distributed import train_ray

    gaps: list = []
    ppo.vtrace = _recording(_vtrace_before_issue_16 if variant == "before" else ppo.vtrace, gaps)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(**fields(args, seed), run_dir=f"{tmp}/run").validate()
        archive = RunArchive.create(cfg.run_dir, cfg.to_dict(), ["bench"])
        try:
            summary = train_ray(cfg, archive, stop=Deadline(args.seconds))
        finally:
            archive.close()
        rows = [json.loads(line) for line in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
    Path(out).write_text(json.dumps({"summary": summary, "rows": rows, "gaps": gaps}))


def curve(rows: list[dict]) -> list[list]:
    """[env_steps, last-100 mean return] at the first row past each GRID multiple."""
    points, next_mark = [], GRID
    for row in rows:
        if row["env_steps"] >= next_mark and row.get("mean_return_last_100") is not None:
            points.append([next_mark, round(row["mean_return_last_100"], 1)])
            next_mark = (row["env_steps"] // GRID + 1) * GRID
    return points


def median_curve(curves: list[list]) -> list[list]:
    """[env_steps, median over seeds] at the grid points every seed reached (runs stop at a deadline)."""
    common = min(len(c) for c in curves) if curves else 0
    return [[curves[0][i][0], sorted(c[i][1] for c in curves)[len(curves) // 2]] for i in range(common)]


def steps_to(rows: list[dict], threshold: float):
    return next((r["env_steps"] for r in rows if (r.get("mean_return_last_100") or 0) >= threshold), None)


def summarise(result: dict, batch_steps: int) -> dict:
    rows = [r for r in result["rows"] if "staleness" in r]
    staleness = sorted(r["staleness"] for r in rows)
    gaps = sorted(g for g, _ in result["gaps"])
    log_rho = sorted(x for _, x in result["gaps"])
    s = result["summary"]
    return {"env_steps": s["env_steps"], "wall_seconds": s["wall_seconds"],
            "final_mean_return": s["mean_return_last_100"], "env_steps_to_475": steps_to(result["rows"], 475.0),
            "staleness_learner_steps_median": staleness[len(staleness) // 2] if staleness else None,
            "staleness_updates_median": staleness[len(staleness) // 2] / batch_steps if staleness else None,
            "advantage_gap_median": gaps[len(gaps) // 2] if gaps else None,
            "mean_abs_log_rho_median": log_rho[len(log_rho) // 2] if log_rho else None,
            "curve": curve(result["rows"])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--results-dir", default=None)
    parser.add_argument("--one", nargs=3, metavar=("VARIANT", "SEED", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one_run(args.one[0], int(args.one[1]), args, args.one[2])
        return

    from rlvitals.config import TrainConfig

    cfg = TrainConfig()
    batch_steps = cfg.update_epochs * cfg.num_minibatches
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for variant in VARIANTS:   # interleaved: machine noise hits both alike
                out = f"{tmp}/{variant}-{seed}.json"
                t0 = time.perf_counter()
                cmd = [sys.executable, __file__, "--one", variant, str(seed), out, "--seconds", str(args.seconds),
                       "--steps", str(args.steps), "--actors", str(args.actors), "--in-flight", str(args.in_flight)]
                for attempt in range(3):   # a loaded machine can time out Ray's start-up: try again
                    if subprocess.run(cmd).returncode == 0:
                        break
                    print(f"{variant} seed {seed}: run failed (attempt {attempt + 1}), retrying", flush=True)
                else:
                    raise SystemExit(f"{variant} seed {seed} failed three times")
                r = summarise(json.loads(Path(out).read_text()), batch_steps)
                runs[variant].append({"seed": seed, **r})
                print(f"{variant:6s} seed {seed}: final {r['final_mean_return']}, to 475 {r['env_steps_to_475']} "
                      f"steps, staleness {r['staleness_learner_steps_median']} learner steps "
                      f"({r['staleness_updates_median']} updates), advantage gap {r['advantage_gap_median']:.3f} std, "
                      f"|log rho| {r['mean_abs_log_rho_median']:.3f}, {r['env_steps']} steps in "
                      f"{time.perf_counter() - t0:.0f} s; curve {r['curve']}", flush=True)
    figures = {v: {"final_mean_return": spread([r["final_mean_return"] for r in rs]),
                   "env_steps_to_475": spread([r["env_steps_to_475"] for r in rs]),
                   "solved_runs": sum(r["env_steps_to_475"] is not None for r in rs),
                   "staleness_updates_median": spread([r["staleness_updates_median"] for r in rs]),
                   "advantage_gap_median": spread([r["advantage_gap_median"] for r in rs]),
                   "mean_abs_log_rho_median": spread([r["mean_abs_log_rho_median"] for r in rs]),
                   "curve_median": median_curve([r["curve"] for r in rs]),
                   "per_seed": rs}
               for v, rs in runs.items()}
    config = {**fields(args, None), "seeds": args.seeds, "budget_seconds": args.seconds,
              "curve_grid_env_steps": GRID, "num_envs": cfg.num_envs, "rollout_length": cfg.rollout_length,
              "learner_steps_per_batch": batch_steps, "variants": {
                  "before": "A_s = delta_s + gamma c_s (v_{s+1} - V(x_{s+1})), c_s = lam min(c_clip, pi/mu)",
                  "after": "A_s = delta_s + gamma lam (v_{s+1} - V(x_{s+1}))"}}
    print(write_result("offpolicy", config, figures, results_dir=args.results_dir))


if __name__ == "__main__":
    main()
