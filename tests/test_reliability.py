"""Crashes, non-finite numbers, bad envs and scrape load: nothing lost, nothing silent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from conftest import free_port, http_get

CLI = [sys.executable, "-m", "rlvitals.cli"]


def start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(CLI + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def load_checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)


def wait_for(predicate, timeout: float = 60.0, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("condition not reached in time")


def test_kill_9_mid_training_then_resume_continues_the_same_run(tmp_path):
    run = tmp_path / "run"
    proc = start(["train", "--total-env-steps", "2000000", "--run-dir", str(run), "--checkpoint-interval", "32",
                  "--verbosity", "minimal", "--progress", "false"])
    ckpt = run / "checkpoints" / "latest.pt"
    wait_for(lambda: ckpt.exists() and load_checkpoint(run)["tracker"]["updates"] >= 3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = load_checkpoint(run)
    assert state["format"] == "rlvitals-checkpoint-v1"
    run_id = json.loads((run / "meta.json").read_text())["run_id"]
    before_steps, before_age = state["tracker"]["env_steps"], state["age"]

    port = free_port()
    resumed = start(["train", "--resume", str(run), "--total-env-steps", str(before_steps + 40_000),
                     "--metrics-port", str(port), "--progress", "false"])
    body = wait_for(lambda: (lambda r: r[1] if r[0] == 200 and b"rlvitals_learner_steps_total" in r[1] else None)(
        http_get(f"http://127.0.0.1:{port}/metrics")), timeout=60)
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["env_steps"] >= before_steps + 40_000
    # Counters went on from the checkpoint instead of restarting at zero.
    line = next(row for row in body.decode().splitlines() if row.startswith("rlvitals_actor_env_steps_total "))
    assert float(line.split()[1]) >= before_steps
    meta = json.loads((run / "meta.json").read_text())
    assert meta["run_id"] == run_id and len(meta["resumes"]) == 1
    assert load_checkpoint(run)["age"] > before_age


@pytest.mark.timeout(900)  # a 100 MB checkpoint per update: minutes on a loaded 2-core machine
def test_kill_9_during_checkpoint_writes_always_leaves_a_loadable_checkpoint(tmp_path):
    """A big network checkpointed after every update spends much of its time writing: kill it repeatedly."""
    run = tmp_path / "run"
    args = ["train", "--total-env-steps", "10000000", "--run-dir", str(run), "--hidden-sizes", "2048,2048",
            "--num-envs", "8", "--rollout-length", "16", "--num-minibatches", "1", "--update-epochs", "1",
            "--checkpoint-interval", "1", "--verbosity", "off", "--progress", "false"]
    proc = start(args)
    wait_for(lambda: (run / "checkpoints" / "latest.pt").exists(), timeout=60)
    mid_write_kills = 0
    temporaries = lambda: list((run / "checkpoints").glob(".*.tmp"))  # noqa: E731
    for attempt in range(12):
        if attempt % 2 == 0:
            # The moment a write is under way (its temporary file is there): a kill timed by the clock alone
            # missed every write on a machine whose disk writes the 100 MB quickly.
            try:
                wait_for(temporaries, timeout=30, every=0.002)
            except AssertionError:
                pass
        else:
            time.sleep(0.3 + 0.137 * attempt % 0.5)   # any moment: between writes as well
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        leftovers = temporaries()
        mid_write_kills += bool(leftovers)
        state = load_checkpoint(run)  # must always load, whatever the moment of the kill
        assert all(torch.isfinite(t).all() for t in state["network"].values() if t.is_floating_point())
        proc = start(["train", "--resume", str(run), "--total-env-steps", "10000000", "--checkpoint-interval", "1",
                      "--verbosity", "off", "--progress", "false"])
        killed_at = state["tracker"]["updates"]
        wait_for(lambda killed_at=killed_at: load_checkpoint(run)["tracker"]["updates"] > killed_at, timeout=180)
        assert not any(p.exists() for p in leftovers), "the resume left a killed write's temporary file behind"
        if mid_write_kills >= 1 and attempt >= 1:   # a mid-write kill and one between writes
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert mid_write_kills >= 1, "no kill landed during a checkpoint write; the test proved nothing"


NAN_ENV = '''
import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

class NanReward(CartPoleEnv):
    """CartPole whose reward is NaN on every step after step EVERY of a process (or never)."""
    count = 0
    def step(self, action):
        obs, reward, term, trunc, info = super().step(action)
        NanReward.count += 1
        if EVERY and NanReward.count % EVERY == 0:
            reward = float("nan")
        return obs, reward, term, trunc, info

gym.register("NanReward-v0", entry_point=NanReward, max_episode_steps=500)
'''


def _nan_env(tmp_path: Path, every: int) -> dict:
    (tmp_path / "nanenv.py").write_text(f"EVERY = {every}\n" + NAN_ENV)
    return {"PYTHONPATH": str(tmp_path)}


def test_occasional_nan_rewards_are_skipped_counted_and_saved(tmp_path):
    run = tmp_path / "run"
    port = free_port()
    proc = start(["train", "--env", "nanenv:NanReward-v0", "--num-envs", "8", "--rollout-length", "32",
                  "--total-env-steps", "16000", "--run-dir", str(run), "--metrics-port", str(port),
                  "--progress", "false"], env=_nan_env(tmp_path, 2000))
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["nonfinite_batches_skipped"] >= 3
    saved = torch.load(run / "nonfinite_batch.pt", weights_only=True)
    assert saved["where"] == "rewards" and torch.isnan(saved["rewards"]).any()
    state = load_checkpoint(run)
    assert all(torch.isfinite(t).all() for t in state["network"].values() if t.is_floating_point())
    assert "non-finite values in rewards" in err


def test_nan_every_batch_stops_the_run_naming_where(tmp_path):
    run = tmp_path / "run"
    proc = start(["train", "--env", "nanenv:NanReward-v0", "--num-envs", "4", "--rollout-length", "16",
                  "--total-env-steps", "100000", "--run-dir", str(run), "--max-nonfinite-batches", "3",
                  "--verbosity", "off", "--progress", "false"], env=_nan_env(tmp_path, 7))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("rlvitals: error: stopping after 3 consecutive batches") and "rewards" in last, err
    assert "Traceback" not in err
    assert (run / "nonfinite_batch.pt").exists() and (run / "summary.json").exists()


HUGE_ENV = '''
import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

class HugeReward(CartPoleEnv):
    """Finite rewards (1e30) whose squares overflow float32: the value loss explodes to inf."""
    def step(self, action):
        obs, reward, term, trunc, info = super().step(action)
        return obs, 1e30, term, trunc, info

gym.register("HugeReward-v0", entry_point=HugeReward, max_episode_steps=500)
'''


def test_exploding_loss_never_reaches_the_weights(tmp_path):
    run = tmp_path / "run"
    (tmp_path / "hugeenv.py").write_text(HUGE_ENV)
    proc = start(["train", "--env", "hugeenv:HugeReward-v0", "--total-env-steps", "50000", "--run-dir", str(run),
                  "--max-nonfinite-batches", "4", "--verbosity", "off", "--progress", "false"],
                 env={"PYTHONPATH": str(tmp_path)})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "consecutive batches with NaN or inf" in err and "appeared first in loss" in err, err
    saved = torch.load(run / "nonfinite_batch.pt", weights_only=True)
    assert saved["where"] == "loss"
    state = load_checkpoint(run)
    for name, tensor in state["network"].items():
        if tensor.is_floating_point():
            assert torch.isfinite(tensor).all(), f"{name} holds NaN/inf"
    assert state["age"] == 0, "a skipped batch must not age the network"


BAD_ENVS = '''
import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

class Later(CartPoleEnv):
    """Behaves for its first step: the pre-flight check steps a fresh env once; the run's envs go wrong later."""
    steps = 0
    def step(self, action):
        self.steps += 1
        return super().step(action)

class WrongShape(Later):
    def step(self, action):
        obs, r, te, tr, info = super().step(action)
        return (obs if self.steps == 1 else np.zeros(7, dtype=np.float32)), r, te, tr, info

class TextReward(Later):
    def step(self, action):
        obs, r, te, tr, info = super().step(action)
        return obs, (r if self.steps == 1 else "lots"), te, tr, info

gym.register("WrongShape-v0", entry_point=WrongShape, max_episode_steps=500)
gym.register("TextReward-v0", entry_point=TextReward, max_episode_steps=500)
'''


@pytest.mark.parametrize("env_id, expected", [("badenvs:WrongShape-v0", "shape"),
                                              ("badenvs:TextReward-v0", "lots")])
def test_a_misbehaving_user_env_is_named_with_its_value(tmp_path, env_id, expected):
    (tmp_path / "badenvs.py").write_text(BAD_ENVS)
    proc = start(["train", "--env", env_id, "--total-env-steps", "2000", "--run-dir", str(tmp_path / "run"),
                  "--verbosity", "off", "--progress", "false"], env={"PYTHONPATH": str(tmp_path)})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    lines = [line for line in err.strip().splitlines() if line.startswith("rlvitals: error:")]
    assert len(lines) == 1 and env_id.split(":")[1] in lines[0] and expected in lines[0], err
    assert "Traceback" not in err


def families(body: bytes) -> set[str]:
    """Names of the metric families in an exposition; empty unless it ends with a newline and parses whole."""
    if not body.endswith(b"\n"):
        return set()
    try:
        return {family.name for family in text_string_to_metric_families(body.decode())}
    except ValueError:
        return set()


def whole(body: bytes, reference: set[str]) -> bool:
    """A complete /metrics answer: it parses, and no family of a whole answer is missing."""
    return reference <= families(body)


@pytest.mark.extended   # 15 s; test_metrics_server keeps a run up while hostile clients hold connections
def test_fifty_concurrent_scrapers_are_all_answered_while_training(tmp_path):
    port = free_port()
    proc = start(["train", "--total-env-steps", "100000000", "--run-dir", str(tmp_path / "run"),
                  "--metrics-port", str(port), "--progress", "false"])
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_for(lambda: http_get(url)[0] == 200, timeout=60)
        # Every family a whole body holds, from one answer before the load; a body cut anywhere lacks some.
        reference = wait_for(lambda: families(http_get(url)[1]), timeout=60)
        assert "rlvitals_run_info" in reference
        first = http_get(url)[1]
        cut_mid_line = first[: len(first) // 2]
        cut_at_a_line = first[: cut_mid_line.rindex(b"\n") + 1]
        assert whole(first, reference) and not whole(cut_mid_line, reference) and not whole(cut_at_a_line, reference)
        stop = time.monotonic() + 10
        answered, failed = [0] * 50, [0] * 50

        def scrape(i):
            while time.monotonic() < stop:
                try:
                    status, body = http_get(url, timeout=30)
                    ok = status == 200 and whole(body, reference)
                except Exception:  # a body cut short (IncompleteRead) is a failed scrape, not a dead thread
                    ok = False
                if ok:
                    answered[i] += 1
                else:
                    failed[i] += 1

        threads = [threading.Thread(target=scrape, args=(i,)) for i in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(failed) == 0, f"{sum(failed)} scrapes failed"
        assert all(n > 0 for n in answered), "some scraper was never answered"
        assert proc.poll() is None, "training died under scrape load"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["status"] == "terminated"  # stopped by SIGTERM


def test_nothing_secret_reaches_the_run_archive_or_the_log(tmp_path):
    secret = "s3cr3t-" + os.urandom(8).hex()
    env = {"GRAFANA_PASSWORD": secret, "RAY_AUTH_TOKEN": secret, "AWS_SECRET_ACCESS_KEY": secret}
    proc = start(["train", "--total-env-steps", "5000", "--run-dir", str(tmp_path / "run"), "--verbosity",
                  "standard", "--progress", "true"], env=env)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert secret not in out and secret not in err
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"secret leaked into {path}"
