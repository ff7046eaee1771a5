"""A run's status, the same word in summary.json, `rlvitals runs` and the report.

Real runs of the CLI in subprocesses, real signals (SIGINT, SIGTERM, SIGKILL), a real env that raises,
the run directory's real lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlvitals.archive import lock_run_dir
from rlvitals.config import TrainConfig
from rlvitals.report.page import runs_section
from rlvitals.report.rundata import load_run
from rlvitals.session import open_archive
from rlvitals.status import recorded_cause, recorded_status, run_status

CLI = [sys.executable, "-m", "rlvitals.cli"]
TESTS = Path(__file__).parent
SMALL = ["--num-envs", "4", "--rollout-length", "32", "--update-epochs", "1", "--num-minibatches", "2",
         "--progress", "false", "--verbosity", "off"]


def train(run_dir: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "train", "--total-env-steps", "50000000", "--run-dir", str(run_dir), *SMALL,
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def wait_for_rows(proc: subprocess.Popen, run_dir: Path, timeout: float = 120) -> None:
    rows, deadline = run_dir / "metrics.jsonl", time.monotonic() + timeout
    while not (rows.is_file() and len(rows.read_text().splitlines()) >= 2):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run wrote no rows in time"
        time.sleep(0.1)


def runs_table(root: Path) -> dict[str, dict]:
    """`rlvitals runs ROOT --json`, run by run name."""
    done = subprocess.run([*CLI, "runs", str(root), "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return {row["run"]: row for row in json.loads(done.stdout)}


def status_column(root: Path) -> dict[str, str]:
    """The status column of the `rlvitals runs ROOT` table as a person sees it (the last column)."""
    done = subprocess.run([*CLI, "runs", str(root)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    header, *lines = done.stdout.splitlines()
    assert header.split()[-1] == "status", header
    return {line.split()[0]: line.split()[-1] for line in lines}


@pytest.mark.slow
def test_live_interrupted_terminated_and_killed_runs_each_have_their_status(tmp_path):
    names = ("sigint", "sigterm", "killed")
    procs = {name: train(tmp_path / name) for name in names}
    try:
        for name, proc in procs.items():
            wait_for_rows(proc, tmp_path / name)
        # A resumed run still has the summary of its previous end while it trains again: it is running.
        (tmp_path / "sigterm" / "summary.json").write_text(json.dumps({"status": "terminated"}))
        assert status_column(tmp_path) == dict.fromkeys(names, "running")
        assert all(load_run(str(tmp_path / name)).status == "running" for name in names)
        procs["sigint"].send_signal(signal.SIGINT)
        procs["sigterm"].send_signal(signal.SIGTERM)
        procs["killed"].send_signal(signal.SIGKILL)
        codes = {name: proc.wait(timeout=120) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    assert codes == {"sigint": 130, "sigterm": 0, "killed": -signal.SIGKILL}, codes
    expected = {"sigint": "interrupted", "sigterm": "terminated", "killed": "crashed"}
    table = runs_table(tmp_path)
    assert {name: row["status"] for name, row in table.items()} == expected
    assert all(row["cause"] is None for row in table.values())
    assert {name: load_run(str(tmp_path / name)).status for name in names} == expected  # the report's word
    assert json.loads((tmp_path / "sigint" / "summary.json").read_text())["status"] == "interrupted"
    assert json.loads((tmp_path / "sigterm" / "summary.json").read_text())["status"] == "terminated"
    assert not (tmp_path / "killed" / "summary.json").exists()
    assert "no summary.json: it crashed" in " ".join(load_run(str(tmp_path / "killed")).notes)

    # The killed run's lock names its pid; a live process that got that pid since is not the run.
    (tmp_path / "killed" / ".lock").write_text(f"{os.getpid()}\n")
    assert run_status(tmp_path / "killed", None) == "crashed"


@pytest.mark.slow
def test_a_run_an_exception_ends_is_failed_with_its_cause_in_one_line(tmp_path):
    pythonpath = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    proc = train(tmp_path / "run", "--env", "bad_envs:StepRaisesLater-v0", env={"PYTHONPATH": pythonpath})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    cause = summary["cause"]
    assert summary["status"] == "failed" and summary["updates"] >= 1, summary
    assert cause.startswith("EnvStepError: env 'bad_envs:StepRaisesLater-v0'") and "\n" not in cause, cause
    assert "RuntimeError at step" in cause and cause.endswith("the simulator crashed"), cause
    row = runs_table(tmp_path)["run"]
    assert (row["status"], row["cause"]) == ("failed", cause)
    run = load_run(str(tmp_path / "run"))
    assert (run.status, run.cause) == ("failed", cause)
    assert f"failed<div class='muted'>{cause.replace(chr(39), '&#x27;')}</div>" in runs_section([run])


def test_a_run_that_ends_before_its_loop_still_says_how(tmp_path):
    cfg = TrainConfig(env="CartPole-v1", run_dir=str(tmp_path / "failed")).validate()
    with pytest.raises(RuntimeError), open_archive(cfg, ["test"]):
        raise RuntimeError("no Ray actor\ncould start")
    summary = json.loads((tmp_path / "failed" / "summary.json").read_text())
    assert summary == {"status": "failed", "cause": "RuntimeError: no Ray actor could start"}
    assert run_status(tmp_path / "failed", summary) == "failed"

    cfg = TrainConfig(env="CartPole-v1", run_dir=str(tmp_path / "interrupted")).validate()
    with pytest.raises(KeyboardInterrupt), open_archive(cfg, ["test"]):
        raise KeyboardInterrupt
    assert json.loads((tmp_path / "interrupted" / "summary.json").read_text()) == {"status": "interrupted"}


def test_older_summaries_read_in_todays_words():
    assert recorded_status({}) == "completed" and recorded_cause({}) is None
    assert recorded_status({"status": "KeyboardInterrupt"}) == "interrupted"
    old = {"status": "ArchiveWriteError"}
    assert (recorded_status(old), recorded_cause(old)) == ("failed", "ArchiveWriteError")
    new = {"status": "failed", "cause": "RuntimeError: boom"}
    assert (recorded_status(new), recorded_cause(new)) == ("failed", "RuntimeError: boom")


def test_a_readers_probe_of_the_lock_never_makes_a_writer_fail(tmp_path):
    # `rlvitals runs` takes the lock shared for an instant; a run starting or resuming then waits it out.
    probe = os.open(tmp_path / ".lock", os.O_RDONLY | os.O_CREAT, 0o600)
    fcntl.flock(probe, fcntl.LOCK_SH)
    threading.Timer(0.1, os.close, [probe]).start()
    fd = lock_run_dir(tmp_path)
    try:
        assert run_status(tmp_path, None) == "running"
    finally:
        os.close(fd)
    assert run_status(tmp_path, None) == "crashed"
