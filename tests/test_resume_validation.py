"""--resume refuses what is not this run's own checkpoint, and one run directory has one writer.

Every refusal: exit 2, one line naming the bad value and what is expected, and the
run directory exactly as it was. Real runs in subprocesses, real files.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

CLI = [sys.executable, "-m", "rlvitals.cli"]
SMALL = ["--num-envs", "4", "--rollout-length", "32", "--update-epochs", "1", "--num-minibatches", "2",
         "--verbosity", "off", "--progress", "false"]

SHAPED_ENV = '''
import os

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

PAD = int(os.environ.get("SHAPED_PAD", "0"))


class Shaped(CartPoleEnv):
    """CartPole whose observation carries PAD extra zeros (its shape changes with the environment variable)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        high = np.full(4 + PAD, np.inf, dtype=np.float32)
        self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)

    def _pad(self, obs):
        return np.concatenate([obs, np.zeros(PAD, dtype=np.float32)])

    def reset(self, **kwargs):
        obs, info = super().reset(**kwargs)
        return self._pad(obs), info

    def step(self, action):
        obs, reward, term, trunc, info = super().step(action)
        return self._pad(obs), reward, term, trunc, info


gym.register("Shaped-v0", entry_point=Shaped, max_episode_steps=500)
'''


def cli(args: list[str], env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def refused(proc: subprocess.CompletedProcess) -> str:
    """The one error line of a refusal (exit 2, no traceback)."""
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr}"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rlvitals: error: "), proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Finished short runs: two CartPole runs (same config, two run ids), one Acrobot run, one Shaped run."""
    root = tmp_path_factory.mktemp("runs")
    (root / "shaped.py").write_text(SHAPED_ENV)
    shaped_env = {"PYTHONPATH": str(root)}
    made, started = {}, {}
    for name, env_id, extra in [("cartpole_a", "CartPole-v1", {}), ("cartpole_b", "CartPole-v1", {}),
                                ("acrobot", "Acrobot-v1", {}), ("shaped", "shaped:Shaped-v0", shaped_env)]:
        # side by side: each is mostly interpreter start-up
        started[name] = subprocess.Popen(
            CLI + ["train", "--env", env_id, "--total-env-steps", "1000", "--run-dir", str(root / name), *SMALL],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **extra})
    for name, proc in started.items():
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        made[name] = root / name
    made["root"] = root
    return made


def copy_run(runs, name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(runs[name], tmp_path / name))


def test_a_checkpoint_of_another_env_is_refused_and_nothing_changes(runs, tmp_path):
    run = copy_run(runs, "cartpole_a", tmp_path)
    shutil.copy(runs["acrobot"] / "checkpoints" / "latest.pt", run / "checkpoints" / "latest.pt")
    before = snapshot(run)
    line = refused(cli(["train", "--resume", str(run), "--total-env-steps", "5000"]))
    assert "'Acrobot-v1'" in line and "'CartPole-v1'" in line and "config.yaml" in line, line
    assert snapshot(run) == before


def test_a_checkpoint_of_another_run_is_refused_and_nothing_changes(runs, tmp_path):
    run = copy_run(runs, "cartpole_a", tmp_path)
    other = json.loads((runs["cartpole_b"] / "meta.json").read_text())["run_id"]
    mine = json.loads((run / "meta.json").read_text())["run_id"]
    shutil.copy(runs["cartpole_b"] / "checkpoints" / "latest.pt", run / "checkpoints" / "latest.pt")
    before = snapshot(run)
    line = refused(cli(["train", "--resume", str(run), "--total-env-steps", "5000"]))
    assert other in line and mine in line, line
    assert snapshot(run) == before


def test_resume_after_the_env_observation_shape_changed_is_refused(runs, tmp_path):
    run = copy_run(runs, "shaped", tmp_path)
    before = snapshot(run)
    line = refused(cli(["train", "--resume", str(run), "--total-env-steps", "5000"],
                       env={"PYTHONPATH": str(runs["root"]), "SHAPED_PAD": "3"}))
    assert "does not fit env 'shaped:Shaped-v0'" in line and "(7,)" in line and "[64, 4]" in line, line
    assert snapshot(run) == before
    # The env as it was: the resume goes on.
    ok = cli(["train", "--resume", str(run), "--total-env-steps", "2000"], env={"PYTHONPATH": str(runs["root"])})
    assert ok.returncode == 0, ok.stderr


class Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.mark.parametrize("content, expected", [
    ({"format": "rlvitals-checkpoint-v1", "config": {}}, "is incomplete: it lacks network"),
    (b"not a checkpoint at all", "is not an rlvitals checkpoint"),
    (Payload(), "is not an rlvitals checkpoint"),
])
def test_a_broken_or_malicious_checkpoint_is_refused_in_one_line(runs, tmp_path, content, expected):
    run = copy_run(runs, "cartpole_a", tmp_path)
    path = run / "checkpoints" / "latest.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, dict):
        torch.save(content, path)
    else:
        path.write_bytes(pickle.dumps(content))
    before = snapshot(run)
    line = refused(cli(["train", "--resume", str(run), "--total-env-steps", "5000"]))
    assert expected in line, line
    assert "weights_only" not in line, "never advise loading a checkpoint with weights_only=False"
    assert snapshot(run) == before


def test_two_processes_cannot_write_one_run_directory(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen(CLI + ["train", "--total-env-steps", "50000000", "--run-dir", str(run),
                                     "--checkpoint-interval", "8", *SMALL],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (run / "checkpoints" / "latest.pt").exists():
            assert holder.poll() is None and time.monotonic() < deadline, holder.communicate()[1]
            time.sleep(0.1)
        line = refused(cli(["train", "--resume", str(run), "--total-env-steps", "60000000"]))
        assert f"in use by process {holder.pid}" in line, line
        assert holder.poll() is None, "the refused resume disturbed the running process"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The kernel released the lock with the process: now the resume may go on.
    ok = cli(["train", "--resume", str(run), "--total-env-steps", str(_steps(run) + 1000)])
    assert ok.returncode == 0, ok.stderr


def _steps(run: Path) -> int:
    return torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["tracker"]["env_steps"]
