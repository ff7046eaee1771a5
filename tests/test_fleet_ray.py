"""Many tiny Ray actors, one slowed on purpose: the run learns, is scraped, and the live verdict names the actor.

8 actors of 4 CartPole envs each (a quarter of a CPU each, on the 2-CPU Ray head of test_ray.py) are
scraped every second by a real Prometheus that evaluates the generated rules
(deploy/prometheus/rules/rlvitals.yml) every second. The env is a test fixture: a CartPole wrapper
of which the first process to take 200 steps claims the slow role (a file made with O_EXCL) and from
then on sleeps 50 ms per env step, so exactly one actor, whichever it is, runs at a small fraction of
its peers' speed. RLActorSlow must fire and name that actor's instance (found from the pid the
wrapper wrote: the port its metrics server listens on) and node; no other fleet rule may name it
falsely. The run's own verdict names it too: the driver compares each actor's speed with its peers'
from the counters on its rollouts (rlvitals/distributed/peers.py), and verdicts.json's
RLActorSlowerThanPeers names the slowed actor by its pid, and no other.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from rules_prometheus import RulesPrometheus
from test_ray import finish, ray_address, ray_args, train  # noqa: F401  (ray_address: the module's Ray head)

from rlvitals.telemetry.health import read_rows
from rlvitals.telemetry.verdicts import read_verdicts

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from fleet_ray import metrics_instance

# Ray starts 8 actor processes at niceness 15: on this shared 2-core machine about 110 s until all are
# scraped, then ~20 s until the slowed one is named (3 minutes in all, measured 2026-11-26).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ACTORS = 8
SLOW_ENV = '''
import os, time
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv

CLAIM = CLAIM_PATH


class MaybeSlowCartPole(CartPoleEnv):
    """CartPole; in the one process that claims the slow role, 50 ms per step."""

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
            time.sleep(0.05)
        return super().step(action)

    def _slow(self):
        try:
            with open(CLAIM) as f:
                return f.read() == str(os.getpid())
        except OSError:
            return False


gym.register("MaybeSlowCartPole-v0", entry_point=MaybeSlowCartPole, max_episode_steps=500)
'''


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
        found, instance, firing, first_up, claimed_after, in_rows = None, None, {}, None, None, False
        start = time.monotonic()
        deadline = start + 300
        while time.monotonic() < deadline and proc.poll() is None and (found is None or not in_rows):
            if instance is None and claim.exists() and claim.read_text():
                instance = metrics_instance(int(claim.read_text()), run_dir / "discovery")
                claimed_after = time.monotonic() - start
            if first_up is None and prom.up_actors() == ACTORS:
                first_up = time.monotonic() - start
            for a in prom.alerts():
                if a["state"] == "firing":
                    firing[a["labels"]["alertname"]] = a
            found = firing.get("RLActorSlow")
            if instance is not None and not in_rows:   # the driver's count, and the row that names the actor
                pid = claim.read_text()
                in_rows = any(f"(pid {pid})" in r.get("actors_slow_named", "")
                              for r in read_rows(run_dir / "metrics.jsonl"))
            time.sleep(1)
        named_after = time.monotonic() - start
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        summary, err = finish(proc)
    finally:
        prom.close()
    assert found is not None, f"RLActorSlow never fired (firing: {sorted(firing)}); stderr:\n{err[-2000:]}"
    print(f"every actor scraped {first_up} s after the start, the slow role claimed after {claimed_after} s, "
          f"the actor named after {named_after:.0f} s")
    assert instance is not None and found["annotations"]["processes"] == f"{instance} on node 127.0.0.1; ", found
    assert found["value"] in ("1e+00", "1"), found
    # The slowed actor may also act with older weights than its peers (its rollouts take longer): that is true.
    # No other actor may be named, and no process is down.
    for name, a in firing.items():
        named = {p.split(" on node ")[0] for p in a["annotations"].get("processes", "").split("; ") if p}
        assert named <= {instance}, f"{name} names healthy actors: {a['annotations']['processes']}"
    assert "RLComponentDown" not in firing
    assert summary["num_actors"] == ACTORS
    # The run's own verdict names the slowed actor, by its pid, and no other.
    slow_pid = claim.read_text()
    verdicts = {v.rule: v for v in read_verdicts(run_dir / "verdicts.json")}
    assert "RLActorSlowerThanPeers" in verdicts, sorted(verdicts)
    message = verdicts["RLActorSlowerThanPeers"].message
    assert f"(pid {slow_pid})" in message and message.count("(pid ") == 1, message
    # No verdict of the run names a healthy actor (silent, or its own batches breaking an invariant).
    for rule, verdict in verdicts.items():
        named = set(re.findall(r"\(pid (\d+)\)", verdict.message))
        assert named <= {slow_pid}, f"{rule} names healthy actors: {verdict.message}"
    returns = [r["return_mean"] for r in read_rows(run_dir / "metrics.jsonl") if r.get("return_mean") is not None]
    assert returns and returns[-1] > 1.5 * returns[0], f"the run did not learn: {returns[:3]} ... {returns[-3:]}"
