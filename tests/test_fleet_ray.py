"""Many tiny Ray actors, one slowed on purpose: the run learns, is scraped, and the live verdict names the actor.

8 actors of 4 CartPole envs each (a quarter of a CPU each, on the 2-CPU Ray head of test_ray.py) are
scraped every second by a real Prometheus that evaluates the generated rules
(deploy/prometheus/rules/rlvitals.yml) every second. The env is a test fixture: a CartPole wrapper
of which the first process to take 200 steps claims the slow role (a file made with O_EXCL) and from
then on sleeps 20 ms per env step, so exactly one actor, whichever it is, runs at a small fraction of
its peers' speed. RLActorSlow must fire and name that actor's instance (found from the pid the
wrapper wrote: the port its metrics server listens on) and node; no other fleet rule may name it
falsely. metrics.jsonl rows hold run-level values only, so this verdict is the live channel's
(docs/health.md); the run's own verdicts.json has no per-actor rule.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from test_ray import finish, ray_address, ray_args, train  # noqa: F401  (ray_address: the module's Ray head)

from conftest import _start, _stop, http_get
from rlvitals.stack.render import render_prometheus_config
from rlvitals.telemetry.health import read_rows

pytestmark = pytest.mark.slow

ACTORS = 8
SLOW_ENV = '''
import os, time
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv

CLAIM = CLAIM_PATH


class MaybeSlowCartPole(CartPoleEnv):
    """CartPole; in the one process that claims the slow role, 20 ms per step."""

    steps = 0

    def step(self, action):
        MaybeSlowCartPole.steps += 1
        if MaybeSlowCartPole.steps == 200:   # past the pre-flight's single step: only actors get here
            try:
                fd = os.open(CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
            except FileExistsError:
                pass
        if MaybeSlowCartPole.steps > 200 and self._slow():
            time.sleep(0.02)
        return super().step(action)

    def _slow(self):
        try:
            with open(CLAIM) as f:
                return f.read() == str(os.getpid())
        except OSError:
            return False


gym.register("MaybeSlowCartPole-v0", entry_point=MaybeSlowCartPole, max_episode_steps=500)
'''


class RulesPrometheus:
    """A Prometheus scraping and evaluating the generated rules every second, watching one run's discovery."""

    def __init__(self, discovery: Path):
        self.tmp = tempfile.TemporaryDirectory(prefix="rlvitals-fleet-ray-")
        root = Path(self.tmp.name)
        config = render_prometheus_config([str(discovery / "*.json")], "1s").replace(
            "evaluation_interval: 5s", "evaluation_interval: 1s")
        (root / "prometheus.yml").write_text(config)
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.skip("the `prometheus` binary is not on PATH (Debian: apt-get install prometheus)")
        self.process, self.url, self.log = _start(binary, root, 0)
        deadline = time.monotonic() + 60
        while http_get(f"{self.url}/-/ready", timeout=1)[0] != 200:
            assert time.monotonic() < deadline and self.process.poll() is None, self.log.read_text()[-2000:]
            time.sleep(0.2)

    def alerts(self) -> list[dict]:
        status, body = http_get(f"{self.url}/api/v1/alerts")
        assert status == 200, body[:300]
        return json.loads(body)["data"]["alerts"]

    def close(self) -> None:
        _stop(self.process)
        self.tmp.cleanup()


def metrics_instance(pid: int) -> str:
    """host:port of the /metrics server a process listens on (the actor's telemetry)."""
    ports = [c.laddr for c in psutil.Process(pid).net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
    assert len(ports) == 1, f"pid {pid} listens on {ports}"
    return f"{ports[0].ip}:{ports[0].port}"


def test_many_tiny_actors_learn_and_the_slowed_one_is_named(ray_address, tmp_path):  # noqa: F811
    claim = tmp_path / "slow-claim"
    (tmp_path / "slowenv.py").write_text(f"CLAIM_PATH = {str(claim)!r}\n" + SLOW_ENV)
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}".rstrip(os.pathsep)}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    prom = RulesPrometheus(run_dir / "discovery")
    try:
        proc = train(ray_args(ray_address, run_dir, "--env", "slowenv:MaybeSlowCartPole-v0",
                              "--num-actors", str(ACTORS), "--actor-cpus", "0.25", "--num-envs", "4",
                              "--rollout-length", "32", "--total-env-steps", "100000000", "--verbosity", "standard",
                              "--startup-timeout-seconds", "240"), env=env)
        found, instance, seen = None, None, set()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and found is None:
            if instance is None and claim.exists() and claim.read_text():
                instance = metrics_instance(int(claim.read_text()))
            for a in prom.alerts():
                seen.add(a["labels"]["alertname"])
                if a["labels"]["alertname"] == "RLActorSlow" and a["state"] == "firing":
                    found = a
            time.sleep(1)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        summary, err = finish(proc)
    finally:
        prom.close()
    assert found is not None, f"RLActorSlow never fired (alerts seen: {sorted(seen)}); stderr:\n{err[-2000:]}"
    assert instance is not None and found["annotations"]["processes"] == f"{instance} on node 127.0.0.1; ", found
    assert found["value"] in ("1e+00", "1"), found
    false = {"RLActorStalled", "RLActorWeightsLagging", "RLActorMemoryGrowing", "RLComponentDown"} & seen
    assert not false, f"other fleet rules fired: {false}"
    assert summary["num_actors"] == ACTORS
    returns = [r["return_mean"] for r in read_rows(run_dir / "metrics.jsonl") if r.get("return_mean") is not None]
    assert returns and returns[-1] > 1.5 * returns[0], f"the run did not learn: {returns[:3]} ... {returns[-3:]}"
