"""Faults outside the bad-input table, each with its real condition (issue 34): a SIGTERM in the middle of an
export, a run directory this user cannot read, an env whose step never returns.

The command runs in a subprocess; the test waits on what it can see (a staging file appearing, the process
ending), never on a guessed duration.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest
from fault_conditions import Unreadable
from test_cli import cli_env, finish, start
from test_hostile_rundirs import fake_run, leftovers
from test_resume_validation import snapshot

HANG_ENVS = '''
import signal
import time

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class Hang(CartPoleEnv):
    """A step that waits for an answer that never comes."""

    def step(self, action):
        time.sleep(3600)


class Stuck(CartPoleEnv):
    """A step no signal reaches, as one stuck in C code would be: SIGALRM blocked, then a wait."""

    def step(self, action):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(3600)


gym.register("Hang-v0", entry_point=Hang, max_episode_steps=500)
gym.register("Stuck-v0", entry_point=Stuck, max_episode_steps=500)
'''


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_sigterm_in_the_middle_of_an_export_leaves_nothing_behind(tmp_path):
    rows = [{"updates": i, "env_steps": 128 * i, "wall_seconds": 0.5 * i, "loss": 1.0 / i} for i in range(1, 100_001)]
    run = fake_run(tmp_path / "run", rows=rows)  # about 5 s of writing: the signal lands in the middle
    before = snapshot(run)
    proc = start(["export", "tensorboard", run], tmp_path)
    deadline = time.monotonic() + 120
    while not list(run.glob(".tensorboard-export-*/events.out.tfevents.*")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the export never opened its event file"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    result = finish(proc)
    assert result.returncode == 143, (result.returncode, result.stderr)
    line = one_line(result.stderr)
    assert line.startswith("rlvitals: terminated (SIGTERM): export stopped") and "partial event file removed" in line
    assert leftovers(run) == [] and snapshot(run) == before, "a stopped export must leave the run as it was"


def test_runs_names_a_run_directory_it_cannot_read(tmp_path):
    unreadable = Unreadable("only")
    if unreadable.unavailable():
        pytest.skip(unreadable.unavailable())
    fake_run(tmp_path / "runs" / "only")
    prefix = unreadable.apply(tmp_path / "runs")
    try:
        result = finish(start(["runs", tmp_path / "runs"], tmp_path, prefix=prefix))
    finally:
        unreadable.undo(tmp_path / "runs")
    assert result.returncode == 0 and result.stdout.strip() == "no runs found", result
    line = one_line(result.stderr)
    assert f"skipped {tmp_path / 'runs' / 'only'}: it cannot be read (Permission denied)" in line, line


def doctor_env(tmp_path: Path, env_id: str, *extra: str):
    (tmp_path / "hang_envs.py").write_text(HANG_ENVS)
    began = time.monotonic()
    result = finish(start(["doctor", "--env", f"hang_envs:{env_id}", *extra], tmp_path,
                          cli_env(PYTHONPATH=str(tmp_path))))
    return result, time.monotonic() - began


def test_doctor_names_an_env_whose_step_blocks_past_the_step_timeout(tmp_path):
    result, seconds = doctor_env(tmp_path, "Hang-v0", "--step-timeout", "1", "--json")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    [verdict] = json.loads(result.stdout)
    assert verdict["rule"] == "doctor-env-step-blocked" and verdict["component"] == "env"
    assert re.match(r"env 'Hang-v0': with the random agent, a step blocked for \d+ s", verdict["message"]), verdict
    assert "step timeout of 1 s (--step-timeout)" in verdict["message"]
    assert seconds < 60, f"took {seconds:.0f} s"  # the first agent's block ends the check


def test_doctor_ends_in_one_line_on_a_step_no_signal_reaches(tmp_path):
    result, seconds = doctor_env(tmp_path, "Stuck-v0", "--step-timeout", "1")
    assert result.returncode == 1, result.stderr
    line = one_line(result.stderr)
    assert line.startswith("rlvitals: env 'Stuck-v0': a step has blocked for "), line
    assert "cannot be interrupted" in line and "doctor-env-step-blocked" in line, line
    assert seconds < 60, f"took {seconds:.0f} s"


def test_the_step_timeout_leaves_the_main_threads_alarm_handler_as_it_was():
    from rlvitals.doctor.steplimit import step_limit

    before = signal.getsignal(signal.SIGALRM)
    with step_limit(1.0, on_stuck=lambda seconds: None):
        assert signal.getsignal(signal.SIGALRM) is not before
    assert signal.getsignal(signal.SIGALRM) is before
