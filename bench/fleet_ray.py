"""Many tiny real Ray actors scraped by a real Prometheus; one is slowed on purpose and must be named.

    nice -n 10 python bench/fleet_ray.py --actors 16 32 [--healthy-seconds 60] [--envs 4]

Per size: a private Ray head (2 CPUs, loopback) and a run of N actors of `--envs` CartPole envs each (the
CPUs shared evenly: 2/N each) that trains PPO at `standard` verbosity, scraped every 5 s by a Prometheus
with the shipped config and the generated rules (deploy/prometheus/rules/rlvitals.yml). Once every actor is
scraped the fleet runs healthy for --healthy-seconds (no fleet alert may fire), then the first actor to
notice a flag file makes its envs sleep 50 ms a step. Reported: when every actor was scraped, the alerts of
the healthy phase, when RLActorSlow fired and whom it named (the slowed actor's instance is found from the
pid it wrote: the port its metrics server listens on), any other fleet alert naming a healthy actor, the
fleet panels' series counts for this run, Prometheus memory, CPU and rule-group times, and whether the run
learned (first and last mean return). Results: bench/results/fleet_ray.json.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet import SCRAPE, Prometheus, alerts, api, eval_figures, rule_times, run_queries, scalar

from rlvitals.telemetry.fleet_rules import FLEET
from rlvitals.telemetry.health import read_rows

RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(16), "PYTHONWARNINGS": "ignore::DeprecationWarning"}
HEAD = """
import ray, sys
ctx = ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False)
ray.get(ray.remote(num_cpus=0)(lambda: 1).remote(), timeout=300)
print(ctx.address_info["gcs_address"], flush=True)
sys.stdin.read()
ray.shutdown()
"""
SLOW_ENV = '''
import os, time
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv

GO, CLAIM = GO_PATH, CLAIM_PATH


class SlowableCartPole(CartPoleEnv):
    """CartPole; once GO exists, the first process to claim CLAIM sleeps 50 ms per env step."""

    steps, slow = 0, None

    def step(self, action):
        cls = SlowableCartPole
        cls.steps += 1
        if cls.slow is None and cls.steps % 100 == 0 and os.path.exists(GO):
            try:
                fd = os.open(CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                cls.slow = True
            except FileExistsError:
                cls.slow = False
        if cls.slow:
            time.sleep(0.05)
        return super().step(action)


gym.register("SlowableCartPole-v0", entry_point=SlowableCartPole, max_episode_steps=500)
'''
FLEET_RULES = {s.name for s in FLEET}


def metrics_instance(pid: int, discovery: Path) -> str | None:
    """host:port of the actor target (its discovery file) whose /metrics server the process `pid` listens on."""
    listening = {c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp")
                 if c.status == psutil.CONN_LISTEN}
    for path in discovery.glob("actor-*.json"):
        try:
            (target,) = json.loads(path.read_text())[0]["targets"]
        except (OSError, ValueError, KeyError, IndexError):
            continue   # being rewritten
        if int(target.rsplit(":", 1)[1]) in listening:
            return target
    return None


def named(alert: dict) -> set[str]:
    return {p.split(" on node ")[0] for p in alert["annotations"].get("processes", "").split("; ") if p}


def wait(what: str, timeout: float, check, proc: subprocess.Popen):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the run ended (exit {proc.returncode}) while waiting for {what}")
        value = check()
        if value:
            return value
        time.sleep(1)
    raise SystemExit(f"{what}: not within {timeout:.0f} s")


def one_size(actors: int, envs: int, healthy_seconds: float, root: Path) -> dict:
    (root / "slowenv.py").write_text(f"GO_PATH = {str(root / 'go')!r}\nCLAIM_PATH = {str(root / 'claim')!r}\n"
                                     + SLOW_ENV)
    run_dir, discovery = root / "run", root / "run" / "discovery"
    run_dir.mkdir()
    env = {**os.environ, **RAY_ENV,
           "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    head = subprocess.Popen([sys.executable, "-c", HEAD], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    prom = proc = None
    try:
        address = head.stdout.readline().strip()
        if not address.startswith("127.0.0.1:"):
            raise SystemExit(f"the Ray head did not start on loopback: {address!r}")
        prom = Prometheus(root, discovery / "*.json")
        stderr = open(root / "train.stderr", "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlvitals.cli", "train", "--mode", "ray", "--address", address, "--run-dir",
             str(run_dir), "--progress", "false", "--startup-timeout-seconds", "900", "--env",
             "slowenv:SlowableCartPole-v0", "--num-actors", str(actors), "--actor-cpus", f"{2 / actors:g}",
             "--num-envs", str(envs), "--rollout-length", "32", "--total-env-steps", "100000000",
             "--verbosity", "standard"], env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
        start = time.monotonic()
        up = f'count(up{{component="actor"}} == 1) >= {actors}'
        wait("every actor scraped", 900, lambda: scalar(prom.url, up), proc)
        scraped_after = time.monotonic() - start
        rss0, cpu0 = prom.usage()
        t0 = time.monotonic()
        evals: dict[str, list[float]] = {}
        seen: set = set()
        intervals: dict[str, float] = {}
        healthy: dict[str, dict] = {}
        while time.monotonic() - t0 < healthy_seconds:
            rule_times(prom.url, evals, seen, intervals)
            for a in alerts(prom.url):
                healthy.setdefault(a["labels"]["alertname"], {"state": a["state"], "processes": sorted(named(a))})
            time.sleep(SCRAPE)
        rss, cpu = prom.usage()
        cpu_share = (cpu - cpu0) / (time.monotonic() - t0)
        run_id = scalar_label(prom.url, 'rlvitals_run_info{component="learner"}', "run_id")
        first_actor = json.loads(sorted(discovery.glob("actor-*.json"))[0].read_text())[0]["targets"][0]
        queries = run_queries(prom.url, int(healthy_seconds), first_actor, run=run_id)
        series = api(prom.url, "status/tsdb")["headStats"]["numSeries"]

        (root / "go").touch()
        slowed_at = time.monotonic()
        claim = root / "claim"
        pid = wait("an actor claiming the slow role", 300, lambda: claim.exists() and claim.read_text(), proc)
        instance = wait("the slowed actor's instance", 60, lambda: metrics_instance(int(pid), discovery), proc)
        firing: dict[str, dict] = {}

        def slow_named():
            for a in alerts(prom.url):
                if a["state"] == "firing" and a["labels"]["alertname"] not in firing:
                    firing[a["labels"]["alertname"]] = {"after_seconds": round(time.monotonic() - slowed_at, 1),
                                                        "value": a["value"], "processes": sorted(named(a))}
            return firing.get("RLActorSlow")

        found = wait("RLActorSlow firing", 300, slow_named, proc)
        time.sleep(2 * SCRAPE)
        slow_named()
        rss_end, _ = prom.usage()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=300)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if prom is not None:
            prom.stop()
        head.stdin.close()
        try:
            head.wait(timeout=120)
        except subprocess.TimeoutExpired:
            head.kill()
    returns = [r["return_mean"] for r in read_rows(run_dir / "metrics.jsonl") if r.get("return_mean") is not None]
    per_panel: dict[str, int] = {}
    for q in queries:
        per_panel[f"{q['dashboard']} / {q['panel']}"] = per_panel.get(f"{q['dashboard']} / {q['panel']}", 0) \
            + q["series"]
    fleet_alerts_naming_healthy = {k: v["processes"] for k, v in firing.items()
                                   if k in FLEET_RULES and set(v["processes"]) - {instance}}
    return {
        "actors": actors, "envs_per_actor": envs, "actor_cpus": round(2 / actors, 4),
        "every_actor_scraped_after_seconds": round(scraped_after, 1), "series_in_head": series,
        "prometheus": {"resident_bytes_healthy": rss, "resident_bytes_at_end": rss_end,
                       "cpu_cores_busy_healthy": round(cpu_share, 3)},
        "rule_group_evaluation_seconds": eval_figures(evals, intervals, "healthy"),
        "dashboard_queries": {"count": len(queries), "max_seconds": max(q["seconds"] for q in queries),
                              "max_series_per_panel": max(per_panel.values()),
                              "fleet_panels": {k: v for k, v in per_panel.items() if "actors" in k.lower()}},
        "healthy_phase_alerts": healthy,
        "healthy_phase_fleet_alerts": sorted(set(healthy) & FLEET_RULES),
        "slowed_instance": instance,
        "slow_verdict": {"fired_after_seconds": found["after_seconds"],
                         "evaluation_intervals": round(found["after_seconds"] / SCRAPE, 1),
                         "value": found["value"], "named": found["processes"],
                         "names_the_slowed_actor": found["processes"] == [instance]},
        "alerts_after_slowdown": firing,
        "fleet_alerts_naming_healthy_actors": fleet_alerts_naming_healthy,
        "return_mean": {"first": returns[0] if returns else None, "last": returns[-1] if returns else None,
                        "rows": len(returns)},
    }


def scalar_label(prom: str, query: str, label: str) -> str:
    result = api(prom, "query", query=query)["result"]
    if not result:
        raise SystemExit(f"no series for {query}")
    return result[0]["metric"][label]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--actors", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--envs", type=int, default=4, help="CartPole envs per actor (default 4)")
    parser.add_argument("--healthy-seconds", type=float, default=60)
    parser.add_argument("--name", default="fleet_ray")
    parser.add_argument("--results-dir", default=None)
    args = parser.parse_args(argv)
    for n in args.actors:
        if n < 3:
            print(f"--actors {n}: need at least 3 (a median and spread of peers to stand out from)", file=sys.stderr)
            return 2
    from common import write_result

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    figures = {}
    for n in args.actors:
        print(f"{n} Ray actors ...", flush=True)
        with tempfile.TemporaryDirectory(prefix="rlvitals-fleet-ray-") as tmp:
            figures[str(n)] = one_size(n, args.envs, args.healthy_seconds, Path(tmp))
        print(json.dumps({k: figures[str(n)][k] for k in ("every_actor_scraped_after_seconds", "slow_verdict",
                                                          "healthy_phase_fleet_alerts", "return_mean")}), flush=True)
    config = {"actors": args.actors, "envs_per_actor": args.envs, "healthy_seconds": args.healthy_seconds,
              "ray_cpus": 2, "scrape_interval_seconds": SCRAPE, "level": "standard", "slowdown": "50 ms per env step"}
    path = write_result("fleet_ray", config, figures, name=args.name, results_dir=args.results_dir)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
