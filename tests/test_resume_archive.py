"""After a crash and --resume the run directory is consistent: real processes, real kills, real files."""

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
SMALL = ["--num-envs", "4", "--rollout-length", "32", "--update-epochs", "2", "--num-minibatches", "2",
         "--progress", "false"]


def start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(CLI + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def wait_for(predicate, timeout: float = 90.0, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("condition not reached in time")


def checkpoint_updates(run: Path) -> int:
    try:
        return torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["tracker"]["updates"]
    except Exception:  # not there yet, or being replaced right now
        return -1


def rows(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_bytes().split(b"\n")
    return [json.loads(line) for line in lines if line.strip()]


def dead_pid() -> int:
    """The pid of a process that has ended (and was reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_kill_9_then_resume_trims_rows_after_the_checkpoint_and_removes_leftovers(tmp_path):
    run = tmp_path / "run"
    # A checkpoint every 5 updates (20 learner steps / 4 per update), a metrics row every update.
    proc = start(["train", "--total-env-steps", "5000000", "--run-dir", str(run), "--checkpoint-interval", "20",
                  "--verbosity", "minimal", *SMALL])
    wait_for(lambda: checkpoint_updates(run) >= 5 and rows(run)[-1]["updates"] > checkpoint_updates(run) + 1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = proc.pid
    ckpt = checkpoint_updates(run)
    before = rows(run)
    assert before[-1]["updates"] > ckpt, "no row after the checkpoint: the test proves nothing"
    targets = list((run / "discovery").glob("*.json"))
    assert [t.name.split("-")[1] for t in targets] == [str(killed)], "the killed process left its discovery file"
    # What a kill during a checkpoint write leaves (the name atomic_write_bytes uses).
    orphan = run / "checkpoints" / f".latest.pt.{killed}.tmp"
    orphan.write_bytes(b"\0" * 4096)

    resumed = start(["train", "--resume", str(run), "--total-env-steps", str(before[-1]["env_steps"] + 3000),
                     "--verbosity", "minimal", "--progress", "false"])
    wait_for(lambda: not orphan.exists() and not any(str(killed) in p.name for p in (run / "discovery").iterdir()),
             timeout=60)
    out, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err
    assert "Traceback" not in err

    after = rows(run)
    kept = [r for r in before if r["updates"] <= ckpt]
    assert after[: len(kept)] == kept, "rows up to the checkpoint must be kept unchanged"
    updates = [r["updates"] for r in after]
    assert updates == sorted(set(updates)), "update numbers repeat or go backwards"
    assert after[len(kept)]["updates"] == ckpt + 1
    steps = [r["env_steps"] for r in after]
    assert steps == sorted(steps)
    meta = json.loads((run / "meta.json").read_text())
    note = meta["resumes"][-1]
    assert note["metrics_rows_removed"] == len(before) - len(kept)
    assert f"checkpoints/{orphan.name}" in note["files_removed"]
    assert any(name.startswith("discovery/") for name in note["files_removed"])
    assert list((run / "discovery").iterdir()) == [], "a finished run leaves no discovery file"
    assert not list(run.rglob("*.tmp"))


def test_a_run_removes_discovery_files_of_dead_processes_when_it_stops(tmp_path):
    run = tmp_path / "run"
    proc = start(["train", "--total-env-steps", "5000000", "--run-dir", str(run), "--verbosity", "minimal", *SMALL])
    wait_for(lambda: (run / "discovery").is_dir() and list((run / "discovery").glob("*.json")))
    pid = dead_pid()
    ghost = run / "discovery" / f"actor-{pid}-40000.json"
    ghost.write_text(json.dumps([{"targets": ["127.0.0.1:40000"], "labels": {"component": "actor"}}]))
    alive = run / "discovery" / f"node-{os.getpid()}-40001.json"  # this test process: alive, kept
    alive.write_text(json.dumps([{"targets": ["127.0.0.1:40001"], "labels": {"component": "node"}}]))
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert not ghost.exists(), "the discovery file of a dead process was left behind"
    assert alive.exists(), "the discovery file of a live process was removed"
    assert sorted(p.name for p in (run / "discovery").iterdir()) == [alive.name]
