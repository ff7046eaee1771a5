"""Every planted bug through every channel, and the healthy runs that must stay quiet (issue 11's benchmark).

Usage: python bench/diagnosis.py [--bugs a,b] [--skip-bugs] [--skip-healthy] [--skip-run] [--seeds N]
                                 [--doctor all|expected|none] [--budget S] [--promtool] [--out PATH]

For each bug of tests/planted_bugs.BUGS:
- `run` channel: tests/diagnose.diagnose on the bug's env (CartPole-v1 unless it says) with the bug
  applied (Ray-mode bugs in Ray mode, from their overrides), stopped at the first warning-or-worse
  verdict or after `--budget` seconds (default 60). The component named is the first loud verdict's; the seconds are
  `Diagnosis.fired_after_s` (run seconds of the row at which it fired; holds count updates, not seconds).
- `doctor` channel (every bug by default; `--doctor expected` only for bugs whose channel is
  `doctor`): rlvitals.doctor.run_doctor with the bug applied. A bug's learning-setting overrides are
  the user's config (`doctor --config`, built as build_config(None, overrides)); a Ray-mode bug also
  gets the Ray leg (`doctor --ray`). The component named is the doctor's first verdict's; the
  seconds are the doctor's wall seconds.
A bug is pinned when some channel's diagnosis names its component (`right`). It is `conflicting` when
another channel named a different component. Each unit (one bug on one channel, one healthy run)
runs in its own process, so a bug's leftovers (monkeypatches, memory kept, Ray) cannot reach the next.

Healthy set: CartPole-v1, Acrobot-v1, Pendulum-v1 and rlvitals/Probe3-v0 with the settings of
tests/test_diagnosis.HEALTHY, CartPole-v1 in Ray's asynchronous loop (RAY_HEALTHY) and, where Box2D is
installed, LunarLander-v3 (BOX2D_HEALTHY), and where MuJoCo is, HalfCheetah-v5, Hopper-v5 and Walker2d-v5 at 1M steps
with CleanRL's published settings (MUJOCO_HEALTHY), each run into
its plateau (STEPS below), seeds 0..N-1, never stopped early. Every warning-or-worse verdict is a false
alarm; loud rules whose condition held at some evaluation without firing (an alert that went pending)
are listed too. `--promtool` also replays each
healthy run through `promtool test rules` (tests/promparity.py).

Writes a table on stdout and bench/results/diagnosis.json (machine, load average at start and end,
per-bug rows, healthy runs, summary). Targets (issues 11 and 20): >= 90% of bugs pinned on the right
component, >= 75% by the live channel alone (no doctor), the first right verdict within 10 updates for bugs
visible from the first batch, median <= 60 s to the first verdict, 0 false alarms, and with --half-speed the
same verdict (rule, component, update) when env, actor and learner run at half speed (Ray's actors too), and
no false alarm on each healthy env's first seed run again at half speed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
TESTS = ROOT / "tests"
sys.path[:0] = [str(BENCH), str(TESTS)]

STEPS = {"CartPole-v1": 200_000, "Acrobot-v1": 200_000, "Pendulum-v1": 300_000, "rlvitals/Probe3-v0": 30_000}
"""Env steps of each healthy run: past the point where its return stops improving (Pendulum: mean
return above -250 with the HEALTHY settings takes about 300k)."""
RAY_HEALTHY = [("CartPole-v1", 200_000, {"mode": "ray", "num_actors": 3, "actor_cpus": 0.5, "torch_threads": 1}),
               ("CartPole-v1", 200_000, {"mode": "ray", "num_actors": 8, "actor_cpus": 0.25, "torch_threads": 1})]
"""Healthy runs of the bench only (too long for the suite): Ray's asynchronous loop, whose batches are
several learner steps stale by design and must raise nothing for it; with 8 actors, enough peers (4) for
each actor to be judged against the others (slow, silent, its own batches' invariants)."""
BOX2D_HEALTHY = [("LunarLander-v3", 1_500_000, {"num_envs": 16, "rollout_length": 1024, "learning_rate": 3e-4,
                                                 "anneal_lr": False, "num_minibatches": 64, "update_epochs": 4,
                                                 "gamma": 0.999, "gae_lambda": 0.98, "entropy_coef": 0.01})]
"""Healthy runs that need Box2D (`pip install -e .[box2d]`): a reward scale of hundreds, both signs, and
long episodes, unlike the suite's envs; skipped where Box2D is not installed. The settings are the usual
tuned PPO ones for LunarLander (long rollouts, gamma 0.999, lambda 0.98, many minibatch steps), which
reach a mean return near +200 by about 1M steps; 1.5M runs past that plateau."""
CLEANRL_MUJOCO = {"num_envs": 1, "rollout_length": 2048, "learning_rate": 3e-4, "anneal_lr": True,
                  "update_epochs": 10, "num_minibatches": 32, "gamma": 0.99, "gae_lambda": 0.95, "clip_coef": 0.2,
                  "entropy_coef": 0.0, "value_coef": 0.5, "max_grad_norm": 0.5, "normalize_observations": True,
                  "normalize_rewards": True}
"""CleanRL ppo_continuous_action.py's published settings (its MuJoCo benchmark, 1M steps)."""
MUJOCO_HEALTHY = [(env, 1_000_000, CLEANRL_MUJOCO) for env in ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5")]
"""Healthy runs that need MuJoCo (`pip install -e .[mujoco]`): Gaussian policies whose entropy has no maximum
(a HalfCheetah run widened its policy past the uniform-box reference and raised RLPolicyEntropyStuckAtMax),
rewards in the thousands, normalised observations and rewards; skipped where MuJoCo is not installed."""
HEALTHY_BUDGET_S = 1800.0
"""Wall-clock cap of one healthy run (it is meant to end on its env steps)."""
TARGETS = {"pinned_fraction": 0.9, "live_pinned_fraction": 0.75, "median_seconds": 60.0, "false_alarms": 0,
           "updates_when_visible_from_the_first_batch": 10, "same_verdict_at_half_speed": 1.0}
LOUD = ("critical", "warning")


# ------------------------------------------------------------------------------------ one unit per process
def _verdict_dicts(verdicts) -> list[dict]:
    return [v.to_dict() for v in verdicts]


def unit_run(job: dict) -> dict:
    from diagnose import diagnose
    from planted_bugs import BY_BUG

    bug = BY_BUG[job["bug"]]
    with tempfile.TemporaryDirectory(prefix="bench-diagnosis-") as tmp:
        t0 = time.perf_counter()
        found = diagnose(Path(tmp) / bug.name, env=bug.env, bug=bug, budget_s=job["budget_s"],
                         stop_on_verdict=True, slowdown=job.get("slowdown", 1.0))
        wall = time.perf_counter() - t0
    first = found.first
    loud = [v for v in found.verdicts if v.severity in LOUD]
    return {"flagged": first is not None, "component": first.component if first else None,
            "rule": first.rule if first else None, "severity": first.severity if first else None,
            "message": first.message if first else None,
            "right": first is not None and first.component == bug.component,
            "seconds": None if found.fired_after_s is None else round(found.fired_after_s, 2),
            "updates": first.first_update if first else None, "env": bug.env, "slowdown": job.get("slowdown", 1.0),
            "wall_s": round(wall, 2), "env_steps": found.summary.get("env_steps"),
            "run_updates": found.summary.get("updates"), "status": found.summary.get("status"),
            "rules_fired": sorted({v.rule for v in loud}), "loud": _verdict_dicts(loud),
            "info": sorted({v.rule for v in found.verdicts if v.severity not in LOUD})}


def doctor_request(bug):
    """The DoctorRequest a user with this bug's settings would make: --config for learning settings, --ray."""
    from rlvitals.config import build_config
    from rlvitals.doctor import DoctorRequest
    from rlvitals.doctor.ladder import LEARNING_SETTINGS

    learning = {k: v for k, v in bug.overrides.items() if k in LEARNING_SETTINGS}
    config = build_config(None, learning) if learning else None
    return DoctorRequest(seed=0, config=config, ray=bug.mode == "ray"), learning


def unit_doctor(job: dict) -> dict:
    import io

    import pytest
    from planted_bugs import BY_BUG, plant_in_ray_workers

    from rlvitals.doctor import run_doctor

    bug = BY_BUG[job["bug"]]
    request, learning = doctor_request(bug)
    report = io.StringIO()
    t0 = time.perf_counter()
    plant_in_ray_workers(bug)   # Ray bugs that live in the actors: Ray starts with them planted (ends with us)
    with pytest.MonkeyPatch.context() as mp:
        bug.apply(mp)
        verdicts = run_doctor(request, stream=report)
    wall = time.perf_counter() - t0
    loud = [v for v in verdicts if v.severity in LOUD]
    first = loud[0] if loud else None
    lines = report.getvalue().splitlines()
    return {"flagged": first is not None, "component": first.component if first else None,
            "rule": first.rule if first else None, "severity": first.severity if first else None,
            "message": first.message if first else None,
            "right": first is not None and first.component == bug.component,
            "seconds": round(wall, 2), "wall_s": round(wall, 2),
            "config_leg": learning or None, "ray_leg": request.ray,
            "rules_fired": sorted({v.rule for v in loud}), "loud": _verdict_dicts(loud),
            "components": sorted({v.component for v in loud}),
            "patterns": [line for line in lines if line.startswith(("pattern,", "ray leg", "doctor finished"))]}


def unit_healthy(job: dict) -> dict:
    from diagnose import diagnose

    with tempfile.TemporaryDirectory(prefix="bench-healthy-") as tmp:
        t0 = time.perf_counter()
        slowdown = job.get("slowdown", 1.0)
        found = diagnose(Path(tmp) / "run", env=job["env"], budget_s=slowdown * HEALTHY_BUDGET_S,
                         stop_on_verdict=False, seed=job["seed"], total_env_steps=job["steps"], slowdown=slowdown,
                         **job["overrides"])
        wall = time.perf_counter() - t0
        pending = _loud_conditions_held(found.rows)
        promtool = None
        if job.get("promtool"):
            from promparity import promtool_test

            try:
                table = promtool_test(found.rows, Path(tmp))
                promtool = {"ok": True, "loud_firing": sorted({rule for (rule, _), v in table.items() if v})}
            except Exception as exc:   # a promtool mismatch raises: record it, keep the bench going
                promtool = {"ok": False, "error": str(exc)[-2000:]}
    loud = [v for v in found.verdicts if v.severity in LOUD]
    return {"env_steps": found.summary.get("env_steps"), "updates": found.summary.get("updates"),
            "mean_return_last_100": found.summary.get("mean_return_last_100"),
            "return_curve": return_curve(found.rows), "wall_s": round(wall, 1),
            "status": found.summary.get("status"), "false_alarms": _verdict_dicts(loud),
            "info": sorted({v.rule for v in found.verdicts if v.severity not in LOUD}),
            "pending_loud_conditions": pending, "promtool": promtool}


def return_curve(rows: list[dict], points: int = 8) -> list[list[float]]:
    """[env steps, mean return of the last 100 episodes] at `points` evenly spaced rows: a run past its plateau
    ends flat."""
    rows = [r for r in rows if r.get("return_mean") is not None and r.get("env_steps") is not None]
    if not rows:
        return []
    picks = sorted({round(i * (len(rows) - 1) / (points - 1)) for i in range(points)})
    return [[rows[i]["env_steps"], round(rows[i]["return_mean"], 1)] for i in picks]


def _loud_conditions_held(rows: list[dict]) -> dict[str, float]:
    """Loud rules whose condition held at some evaluation (an alert that went pending), with the first time."""
    from rlvitals.telemetry.health import HealthMonitor
    from rlvitals.telemetry.rules import BY_RULE

    monitor = HealthMonitor()
    monitor.record_history()
    for row in rows:
        monitor(row)
    monitor.finish()
    held = {}
    for name, history in monitor.history.items():
        times = [t for t, holds in history if holds]
        if times and BY_RULE[name].severity in LOUD:
            held[name] = round(times[0], 1)
    return held


UNITS = {"run": unit_run, "doctor": unit_doctor, "healthy": unit_healthy}


def run_unit(job: dict, timeout: float) -> dict:
    """One unit in a fresh interpreter (this file with --unit); its result, or what went wrong."""
    with tempfile.NamedTemporaryFile("w+", suffix=".json", delete=False) as f:
        out = Path(f.name)
    t0 = time.perf_counter()
    # Its own process group: on a timeout the whole group goes, Ray's helper processes included.
    proc = subprocess.Popen([sys.executable, __file__, "--unit", json.dumps(job), "--unit-out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        if proc.returncode == 0 and out.stat().st_size:
            return json.loads(out.read_text())
        return {"error": f"exit {proc.returncode}: {(stderr or stdout)[-3000:]}",
                "wall_s": round(time.perf_counter() - t0, 1)}
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"error": f"timed out after {timeout:.0f} s (killed)", "wall_s": round(time.perf_counter() - t0, 1)}
    finally:
        out.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------ the bench
def bug_row(bug, results: dict[str, dict]) -> dict:
    """One bug's row: each channel's result, and whether/when some channel pinned it on its component."""
    done = {ch: r for ch, r in results.items() if "error" not in r}
    flagged_by = [ch for ch, r in done.items() if r["flagged"]]
    right_by = [ch for ch in flagged_by if done[ch]["right"]]
    wrong = {ch: f"{done[ch]['component']} ({done[ch]['rule']})" for ch in flagged_by if not done[ch]["right"]}
    seconds = min((done[ch]["seconds"] for ch in right_by if done[ch]["seconds"] is not None), default=None)
    expected = done.get(bug.channel)
    live, slow = done.get("run"), done.get("run_half_speed")
    same_at_half_speed = None if live is None or slow is None else (
        (live["rule"], live["component"], live["updates"]) == (slow["rule"], slow["component"], slow["updates"]))
    return {"bug": bug.name, "component": bug.component, "expected_channel": bug.channel, "mode": bug.mode,
            "overrides": bug.overrides, "what": bug.what, "flagged": bool(flagged_by), "flagged_by": flagged_by,
            "pinned": bool(right_by), "pinned_by": right_by, "wrong_components": wrong,
            "pinned_by_expected_channel": bool(expected and expected["flagged"] and expected["right"]),
            "seconds_to_first_right_verdict": seconds, "invariant": bug.invariant, "env": bug.env,
            "live_pinned": bool(live and live["flagged"] and live["right"]),
            "updates_to_first_right_live_verdict": live["updates"] if live and live["right"] else None,
            "same_verdict_at_half_speed": same_at_half_speed, "channels": results}


def _box2d_healthy() -> list:
    try:
        import Box2D  # noqa: F401
    except ImportError:
        print("Box2D is not installed: LunarLander-v3 is left out of the healthy set", file=sys.stderr)
        return []
    return BOX2D_HEALTHY


def _mujoco_healthy() -> list:
    try:
        import mujoco  # noqa: F401
    except ImportError:
        print("MuJoCo is not installed: HalfCheetah, Hopper and Walker2d are left out of the healthy set",
              file=sys.stderr)
        return []
    return MUJOCO_HEALTHY


def healthy_jobs(seeds: int, promtool: bool, half_speed: bool = False, full_speed: bool = True,
                 first_seed: int = 0) -> list[dict]:
    """Each healthy env at `seeds` seeds from `first_seed`; with `half_speed`, the first seed once more with
    everything twice as slow (with `full_speed` False, only that one)."""
    from test_diagnosis import HEALTHY

    jobs = []
    # a pytest.param (a case the suite marks extended) holds its tuple in .values
    every = [getattr(h, "values", h) for h in HEALTHY] + RAY_HEALTHY + _box2d_healthy() + _mujoco_healthy()
    for env, steps, overrides in every:
        for seed in range(first_seed, first_seed + seeds):
            jobs.append({"kind": "healthy", "env": env, "seed": seed, "steps": STEPS.get(env, steps),
                         "overrides": overrides, "promtool": promtool})
        if half_speed:
            jobs.append({**jobs[-seeds], "slowdown": 2.0})
        if not full_speed:
            del jobs[-1 - seeds:-1]
    return jobs


def summarize(rows: list[dict], healthy: list[dict]) -> dict:
    n = len(rows)
    pinned = [r for r in rows if r["pinned"]]
    seconds = [r["seconds_to_first_right_verdict"] for r in pinned if r["seconds_to_first_right_verdict"] is not None]
    by_channel = {}
    for ch in ("run", "doctor"):
        ran = [r for r in rows if ch in r["channels"] and "error" not in r["channels"][ch]]
        secs = [r["channels"][ch]["seconds"] for r in ran if r["channels"][ch]["right"]]
        by_channel[ch] = {"bugs": len(ran), "flagged": sum(r["channels"][ch]["flagged"] for r in ran),
                          "right": sum(r["channels"][ch]["right"] for r in ran),
                          "median_seconds_when_right": statistics.median(secs) if secs else None}
    alarms = [{"env": h["env"], "seed": h["seed"], "rule": v["rule"], "severity": v["severity"],
               "component": v["component"], "first_seconds": v["first_seconds"], "message": v["message"]}
              for h in healthy for v in h.get("false_alarms", [])]
    out = {
        "bugs": n, "flagged": sum(r["flagged"] for r in rows), "pinned": len(pinned),
        "pinned_fraction": len(pinned) / n if n else None,
        "pinned_by_expected_channel": sum(r["pinned_by_expected_channel"] for r in rows),
        "conflicting": [r["bug"] for r in rows if r["wrong_components"]],
        "median_seconds_to_first_right_verdict": statistics.median(seconds) if seconds else None,
        "by_channel": by_channel,
        "healthy_runs": len(healthy), "healthy_runs_failed": sum("error" in h for h in healthy),
        "false_alarms": len(alarms) if healthy else None, "false_alarm_list": alarms,
        "pending_loud_conditions": [{"env": h["env"], "seed": h["seed"], "rules": h["pending_loud_conditions"]}
                                    for h in healthy if h.get("pending_loud_conditions")],
        "errors": [f"{r['bug']}/{ch}: {c['error'][:300]}" for r in rows for ch, c in r["channels"].items()
                   if "error" in c] + [f"{h['env']} seed {h['seed']}: {h['error'][:300]}" for h in healthy
                                       if "error" in h],
    }
    live_updates = [r["updates_to_first_right_live_verdict"] for r in rows
                    if r["updates_to_first_right_live_verdict"] is not None]
    compared = [r["same_verdict_at_half_speed"] for r in rows if r["same_verdict_at_half_speed"] is not None]
    out.update({
        "live_pinned": sum(r["live_pinned"] for r in rows),
        "live_pinned_fraction": sum(r["live_pinned"] for r in rows) / n if n else None,
        "median_updates_to_first_right_live_verdict": statistics.median(live_updates) if live_updates else None,
        "live_right_within_10_updates": sum(u <= 10 for u in live_updates),
        "half_speed_compared": len(compared), "same_verdict_at_half_speed": sum(compared),
        "half_speed_differs": [r["bug"] for r in rows if r["same_verdict_at_half_speed"] is False],
    })
    out["targets"] = TARGETS
    out["targets_met"] = {
        "pinned_fraction": out["pinned_fraction"] is not None and out["pinned_fraction"] >= TARGETS["pinned_fraction"],
        "median_seconds": out["median_seconds_to_first_right_verdict"] is not None
        and out["median_seconds_to_first_right_verdict"] <= TARGETS["median_seconds"],
        "false_alarms": None if not healthy else (out["false_alarms"] == 0 and not out["healthy_runs_failed"]),
        "live_pinned_fraction": out["live_pinned_fraction"] is not None
        and out["live_pinned_fraction"] >= TARGETS["live_pinned_fraction"],
        "same_verdict_at_half_speed": None if not compared else all(compared),
    }
    return out


def _cell(result: dict | None) -> str:
    if result is None:
        return "-"
    if "error" in result:
        return "ERROR"
    if not result["flagged"]:
        return "quiet"
    secs = f"{result['seconds']:.0f}s" if result["seconds"] is not None else "?"
    return f"{result['component']} {'ok' if result['right'] else 'WRONG'} {secs} ({result['rule']})"


def print_table(rows: list[dict], healthy: list[dict], summary: dict) -> None:
    print("\nbug                                  want           exp.    run channel / doctor channel")
    for r in rows:
        print(f"{r['bug']:36s} {r['component']:14s} {r['expected_channel']:7s} "
              f"run: {_cell(r['channels'].get('run'))}")
        print(f"{'':36s} {'':14s} {'':7s} doctor: {_cell(r['channels'].get('doctor'))}")
    if healthy:
        print("\nhealthy run                    seed  env steps  mean return  wall s  false alarms / pending")
        for h in healthy:
            name = (h["env"] + (" (ray)" if h.get("overrides", {}).get("mode") == "ray" else "")
                    + (" 1/2 speed" if h.get("slowdown", 1.0) != 1.0 else ""))
            if "error" in h:
                print(f"{name:30s} {h['seed']:4d}  ERROR {h['error'][:100]}")
                continue
            alarms = ", ".join(v["rule"] for v in h["false_alarms"]) or "0"
            pending = ", ".join(h["pending_loud_conditions"]) or "-"
            ret = h["mean_return_last_100"]
            print(f"{name:30s} {h['seed']:4d}  {h['env_steps']:9d}  {ret if ret is None else round(ret, 1)!s:>11}"
                  f"  {h['wall_s']:6.0f}  {alarms} / {pending}")
    s = summary
    frac = "n/a" if s["pinned_fraction"] is None else f"{100 * s['pinned_fraction']:.0f}%"
    print(f"\npinned on the right component: {s['pinned']}/{s['bugs']} ({frac}; target >= 90%), "
          f"by the expected channel {s['pinned_by_expected_channel']}/{s['bugs']}")
    print(f"median seconds to the first right verdict: {s['median_seconds_to_first_right_verdict']} (target <= 60)")
    live = "n/a" if s["live_pinned_fraction"] is None else f"{100 * s['live_pinned_fraction']:.0f}%"
    print(f"pinned by the live channel alone: {s['live_pinned']}/{s['bugs']} ({live}; target >= 75%); median "
          f"updates to its first right verdict {s['median_updates_to_first_right_live_verdict']}, "
          f"{s['live_right_within_10_updates']} within 10 updates")
    if s["half_speed_compared"]:
        print(f"same verdict at half speed: {s['same_verdict_at_half_speed']}/{s['half_speed_compared']}"
              + (f" (differs: {', '.join(s['half_speed_differs'])})" if s["half_speed_differs"] else ""))
    if healthy:
        print(f"false alarms on {s['healthy_runs']} healthy runs: {s['false_alarms']} (target 0)")
    if s["conflicting"]:
        print(f"a channel named a wrong component for: {', '.join(s['conflicting'])}")
    for e in s["errors"]:
        print(f"error: {e}")


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bugs", default="", help="comma-separated planted-bug names (default: all)")
    p.add_argument("--skip-bugs", action="store_true", help="only the healthy set")
    p.add_argument("--skip-healthy", action="store_true", help="only the planted bugs")
    p.add_argument("--skip-run", action="store_true", help="no run channel (the doctor and healthy set only)")
    p.add_argument("--seeds", type=int, default=3, help="healthy seeds per env (default 3)")
    p.add_argument("--first-seed", type=int, default=0, help="the healthy runs' first seed (default 0)")
    p.add_argument("--envs", default="", help="comma-separated healthy envs (default: all of HEALTHY)")
    p.add_argument("--ray-only", action="store_true", help="healthy set: only the Ray runs")
    p.add_argument("--doctor", choices=("all", "expected", "none"), default="all",
                   help="run the doctor for every bug (default), only for doctor-channel bugs, or never")
    p.add_argument("--budget", type=float, default=60.0, help="run-channel budget, seconds (default 60)")
    p.add_argument("--promtool", action="store_true", help="replay healthy runs through promtool test rules")
    p.add_argument("--half-speed", action="store_true",
                   help="run each bug's run channel again, and each healthy env's first seed, with env, actor "
                        "and learner slowed 2x: the verdicts must match (healthy: none)")
    p.add_argument("--half-speed-only", action="store_true",
                   help="healthy set: only each env's first seed at half speed (its full-speed runs measured apart)")
    p.add_argument("--out", default=str(BENCH / "results" / "diagnosis.json"))
    p.add_argument("--unit", help=argparse.SUPPRESS)
    p.add_argument("--unit-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.unit:
        job = json.loads(args.unit)
        result = UNITS[job["kind"]](job)
        Path(args.unit_out).write_text(json.dumps(result, default=str))
        return Path(args.unit_out)

    from planted_bugs import BUGS, BY_BUG

    from common import machine_info

    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    load_start = os.getloadavg()
    machine = machine_info()   # at the start: the code that ran (others may commit while it runs)
    t_start = time.perf_counter()
    names = [n for n in args.bugs.split(",") if n] if args.bugs else [b.name for b in BUGS]
    unknown = [n for n in names if n not in BY_BUG]
    if unknown:
        raise SystemExit(f"unknown bugs: {', '.join(unknown)} (known: {', '.join(BY_BUG)})")
    bugs = [] if args.skip_bugs else [BY_BUG[n] for n in names]

    rows = []
    for bug in bugs:
        results = {}
        if not args.skip_run:
            budget = args.budget * bug.budget_scale
            results["run"] = run_unit({"kind": "run", "bug": bug.name, "budget_s": budget}, timeout=budget + 240)
            print(f"{bug.name}: run: {_cell(results['run'])}", flush=True)
            if args.half_speed:
                results["run_half_speed"] = run_unit({"kind": "run", "bug": bug.name, "budget_s": 2 * budget,
                                                      "slowdown": 2.0}, timeout=2 * budget + 240)
                print(f"{bug.name}: run at half speed: {_cell(results['run_half_speed'])}", flush=True)
        if args.doctor == "all" or (args.doctor == "expected" and bug.channel == "doctor"):
            results["doctor"] = run_unit({"kind": "doctor", "bug": bug.name}, timeout=1200)
            print(f"{bug.name}: doctor: {_cell(results['doctor'])}", flush=True)
        rows.append(bug_row(bug, results))

    healthy = []
    if not args.skip_healthy:
        envs = [e for e in args.envs.split(",") if e]
        for job in healthy_jobs(args.seeds, args.promtool, args.half_speed or args.half_speed_only,
                                not args.half_speed_only, args.first_seed):
            if (envs and job["env"] not in envs) or (args.ray_only and job["overrides"].get("mode") != "ray"):
                continue
            result = run_unit(job, timeout=job.get("slowdown", 1.0) * HEALTHY_BUDGET_S + 300)
            healthy.append({"env": job["env"], "seed": job["seed"], "steps": job["steps"],
                            "slowdown": job.get("slowdown", 1.0),
                            "overrides": job["overrides"], **result})
            h = healthy[-1]
            print(f"healthy {job['env']} seed {job['seed']}"
                  + (f" at 1/{job['slowdown']:g} speed" if job.get("slowdown", 1.0) != 1.0 else "") + ": "
                  + (f"ERROR {h['error'][:200]}" if "error" in h else
                     f"{h['env_steps']} steps, mean return {h['mean_return_last_100']}, "
                     f"{len(h['false_alarms'])} false alarms, pending {list(h['pending_loud_conditions'])}"),
                  flush=True)

    summary = summarize(rows, healthy)
    print_table(rows, healthy, summary)
    payload = {
        "scenario": "diagnosis", "when": started, "seconds": round(time.perf_counter() - t_start, 1),
        "command": " ".join(["python", "bench/diagnosis.py", *(argv if argv is not None else sys.argv[1:])]),
        "config": {"run_channel": {"env": "CartPole-v1", "budget_s": args.budget, "stop_on_verdict": True},
                   "doctor": args.doctor, "healthy_steps": STEPS, "healthy_seeds": args.seeds,
                   "healthy_budget_s": HEALTHY_BUDGET_S, "promtool": args.promtool},
        "code_version": machine["code_version"],
        "machine": {**machine, "load_average_start": [round(x, 2) for x in load_start],
                    "load_average_end": [round(x, 2) for x in os.getloadavg()]},
        "summary": summary, "bugs": rows, "healthy": healthy,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    print(out)
    return out


if __name__ == "__main__":
    main()
