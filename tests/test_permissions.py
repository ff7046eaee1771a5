"""Run directories are owner-only unless the run asks for group access: real runs, then os.stat of every entry.

The runs start under umask 022 (the usual default), so that what the test sees is what rlvitals sets, not
what a strict umask of the machine running the tests would have hidden.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

from test_resume_archive import wait_for

from conftest import prometheus_watching

CLI = [sys.executable, "-m", "rlvitals.cli"]
SMALL = ["--num-envs", "4", "--rollout-length", "32", "--update-epochs", "1", "--num-minibatches", "2",
         "--checkpoint-interval", "2", "--progress", "false", "--tensorboard", "true"]


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(CLI + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: os.umask(0o022))


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    return out


def modes(run: Path) -> dict[str, str]:
    """Every folder and file of the run directory (itself as "."), with its permission bits in octal."""
    entries = [run, *sorted(run.rglob("*"))]
    return {str(p.relative_to(run)): oct(stat.S_IMODE(os.stat(p).st_mode)) for p in entries}


def assert_all(run: Path, folder: int, file: int) -> None:
    found = modes(run)
    expected = {name: oct(folder if (run / name).is_dir() else file) for name in found}
    assert found == expected
    # What the archive is made of, so that an empty or half-written directory cannot pass.
    for name in ("config.yaml", "meta.json", "metrics.jsonl", "summary.json", "checkpoints/latest.pt",
                 "verdicts.json", ".lock"):
        assert name in found, f"{name} missing from the run directory: {sorted(found)}"
    assert any(name.startswith("events.out.tfevents") for name in found), "no TensorBoard event file"


def test_a_run_directory_is_owner_only_and_its_prometheus_still_reads_the_discovery_file(tmp_path):
    run = tmp_path / "run"
    proc = start(["train", "--total-env-steps", "10000000", "--run-dir", str(run), "--verbosity", "standard",
                  *SMALL])
    try:
        target = wait_for(lambda: next((run / "discovery").glob("*.json"), None))
        assert oct(stat.S_IMODE(target.stat().st_mode)) == oct(0o600)
        assert oct(stat.S_IMODE((run / "discovery").stat().st_mode)) == oct(0o700)
        wait_for(lambda: (run / "metrics.jsonl").exists() and (run / "checkpoints" / "latest.pt").exists())
        live = modes(run)
        assert live["."] == oct(0o700) and live["meta.json"] == live["checkpoints/latest.pt"] == oct(0o600)
        # Prometheus started by the same user (as `rlvitals stack up` starts it) reads the owner-only file.
        with prometheus_watching(run / "discovery") as prometheus:
            up = wait_for(lambda: [t for t in prometheus.targets() if t["health"] == "up"], timeout=60)
            assert up[0]["labels"]["run_id"] == json.loads((run / "meta.json").read_text())["run_id"]
    finally:
        proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert (run / "summary.json").exists()
    assert_all(run, folder=0o700, file=0o600)


def test_group_readable_gives_the_group_read_access_and_a_resume_may_turn_it_on(tmp_path):
    shared, private = tmp_path / "shared", tmp_path / "private"
    finish(start(["train", "--total-env-steps", "1024", "--run-dir", str(shared), "--group-readable", *SMALL]))
    assert_all(shared, folder=0o750, file=0o640)

    finish(start(["train", "--total-env-steps", "1024", "--run-dir", str(private), *SMALL]))
    assert_all(private, folder=0o700, file=0o600)
    finish(start(["train", "--resume", str(private), "--total-env-steps", "2048", "--group-readable", "true",
                  "--progress", "false"]))
    assert_all(private, folder=0o750, file=0o640)
