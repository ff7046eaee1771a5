"""SIGTERM and SIGINT end a run promptly, even while an env step hangs, and say only what was written.

A real CartPole subclass that hangs inside step() once the test asks it to, the CLI
in a subprocess, real signals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

CLI = [sys.executable, "-m", "rlvitals.cli"]
SMALL = ["--num-envs", "4", "--rollout-length", "32", "--update-epochs", "1", "--num-minibatches", "2",
         "--progress", "false"]

HANG_ENV = '''
import os
import time

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

TRIGGER, HUNG = os.environ["HANG_TRIGGER"], os.environ["HANG_MARK"]


class Hang(CartPoleEnv):
    """CartPole whose step() blocks for an hour once the file TRIGGER exists (it writes HUNG first)."""

    def step(self, action):
        if os.path.exists(TRIGGER):
            open(HUNG, "w").close()
            time.sleep(3600)
        return super().step(action)


gym.register("Hang-v0", entry_point=Hang, max_episode_steps=500)
'''


class HangingRun:
    def __init__(self, tmp_path: Path, *extra: str):
        (tmp_path / "hangenv.py").write_text(HANG_ENV)
        self.trigger, self.hung = tmp_path / "trigger", tmp_path / "hung"
        self.run = tmp_path / "run"
        self.err_path = tmp_path / "stderr.log"   # a file, so a test can read what was said while it runs
        env = {**os.environ, "PYTHONPATH": str(tmp_path), "HANG_TRIGGER": str(self.trigger),
               "HANG_MARK": str(self.hung)}
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(CLI + ["train", "--env", "hangenv:Hang-v0", "--total-env-steps", "50000000",
                                                "--run-dir", str(self.run), *SMALL, *extra],
                                         stdout=subprocess.PIPE, stderr=err, text=True, env=env)

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_until(self, predicate, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.proc.poll() is None, self.stderr()
            assert time.monotonic() < deadline, "condition not reached in time"
            time.sleep(0.05)

    def hang(self) -> None:
        self.trigger.touch()
        self.wait_until(self.hung.exists)

    def end(self, timeout: float) -> tuple[int, str, str, float]:
        t0 = time.monotonic()
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.communicate()
        return self.proc.returncode, out, self.stderr(), time.monotonic() - t0

    def summary(self) -> dict:
        return json.loads((self.run / "summary.json").read_text())


def checkpoint_updates(run: Path) -> int:
    try:
        return torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["tracker"]["updates"]
    except Exception:
        return -1


def last_line(err: str) -> str:
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.strip()][-1]


def test_sigterm_while_an_env_step_hangs_ends_the_run_and_writes_the_archive(tmp_path):
    run = HangingRun(tmp_path, "--checkpoint-interval", "8", "--verbosity", "minimal")
    run.wait_until(lambda: checkpoint_updates(run.run) >= 2)
    run.hang()
    run.proc.send_signal(signal.SIGTERM)
    code, out, err, seconds = run.end(timeout=60)
    assert code == 143, err
    assert seconds < 20, f"took {seconds:.1f} s to stop with a hung env step"
    line = last_line(err)
    assert line.startswith("rlvitals: terminated (env step blocked for ") and "summary.json written" in line, err
    summary = run.summary()
    assert summary["status"] == "terminated"
    assert f"checkpoint of update {summary['updates']} written" in line, line
    assert checkpoint_updates(run.run) == summary["updates"]
    assert not list(run.run.rglob("*.tmp")) and not list((run.run / "discovery").iterdir())


def test_a_second_sigterm_stops_a_hung_run_at_once(tmp_path):
    run = HangingRun(tmp_path, "--checkpoint-interval", "8", "--verbosity", "off")
    run.wait_until(lambda: checkpoint_updates(run.run) >= 1)
    run.hang()
    run.proc.send_signal(signal.SIGTERM)
    run.wait_until(lambda: "SIGTERM received: stopping after this update" in run.stderr())  # the first was taken
    run.proc.send_signal(signal.SIGTERM)
    code, out, err, seconds = run.end(timeout=60)
    assert code == 143, err
    assert seconds < 20, f"took {seconds:.1f} s after a second SIGTERM"
    # The reason proves it was the second signal, not the watchdog (which waits 5 s), that ended the run.
    assert last_line(err).startswith("rlvitals: terminated (second SIGTERM): checkpoint of update"), err
    assert run.summary()["status"] == "terminated"


def test_sigint_says_no_checkpoint_was_written_when_none_was(tmp_path):
    run = HangingRun(tmp_path, "--agent", "random", "--verbosity", "off")  # a probe agent never checkpoints
    run.wait_until(lambda: (run.run / "metrics.jsonl").exists() and (run.run / "metrics.jsonl").stat().st_size)
    run.proc.send_signal(signal.SIGINT)
    code, out, err, seconds = run.end(timeout=60)
    assert code == 130, err
    line = last_line(err)
    assert line.startswith("rlvitals: interrupted after update ") and "no checkpoint written" in line, err
    assert "checkpoint of update" not in err
    assert json.loads(out.strip().splitlines()[-1])["status"] == "interrupted" == run.summary()["status"]
    assert not (run.run / "checkpoints" / "latest.pt").exists()


def test_the_first_sigterm_finishes_the_update_and_exits_zero(tmp_path):
    run = HangingRun(tmp_path, "--checkpoint-interval", "8", "--verbosity", "off")
    run.wait_until(lambda: checkpoint_updates(run.run) >= 1)
    run.proc.send_signal(signal.SIGTERM)
    code, out, err, _ = run.end(timeout=60)
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "terminated" and checkpoint_updates(run.run) == summary["updates"]
    assert last_line(err).startswith(f"rlvitals: terminated after update {summary['updates']}: checkpoint of "
                                     f"update {summary['updates']} written, summary.json written"), err
