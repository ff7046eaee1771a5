"""Retired config fields (config.RETIRED_FIELDS): a config file or an older run that holds one still loads."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
import yaml

CLI = [sys.executable, "-m", "rlvitals.cli"]
SMALL = ["--num-envs", "4", "--rollout-length", "32", "--update-epochs", "1", "--num-minibatches", "2",
         "--progress", "false", "--verbosity", "off"]


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, timeout=240)


def test_a_config_file_with_log_every_updates_trains_with_one_warning_line(tmp_path):
    config = tmp_path / "old.yaml"
    config.write_text("env: CartPole-v1\nlog_every_updates: 5\n")
    done = cli("train", "--config", config, "--total-env-steps", 512, "--run-dir", tmp_path / "run", *SMALL)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "log_every_updates" in line]
    assert len(warnings) == 1 and warnings[0].startswith("rlvitals: ") and "ignored" in warnings[0]
    assert "log_every_updates" not in yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())


def test_the_flag_is_gone():
    done = cli("train", "--log-every-updates", 5)
    assert done.returncode == 2 and "--log-every-updates" in done.stderr


def test_an_older_run_that_holds_it_resumes_and_evaluates(tmp_path):
    run = tmp_path / "run"
    assert cli("train", "--total-env-steps", 512, "--run-dir", run, *SMALL).returncode == 0
    # Make it a run of the version that had the field: in config.yaml and in the checkpoint's config.
    saved = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump({**saved, "log_every_updates": 10}))
    checkpoint = run / "checkpoints" / "latest.pt"
    state = torch.load(checkpoint, weights_only=True)
    state["config"]["log_every_updates"] = 10
    torch.save(state, checkpoint)

    evaluated = cli("eval", "--run-dir", run, "--episodes", 2)
    assert evaluated.returncode == 0, evaluated.stderr
    resumed = cli("train", "--resume", run, "--total-env-steps", 1024, "--progress", "false")
    assert resumed.returncode == 0, resumed.stderr
    assert "log_every_updates" not in resumed.stderr  # nothing the user could act on
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["env_steps"] >= 1024
    table = cli("runs", tmp_path)
    assert table.returncode == 0 and "log_every_updates" not in table.stdout, table.stdout + table.stderr
