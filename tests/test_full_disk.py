"""A full disk (a small tmpfs) or a file-size limit: one clear line, summary.json, no temporary left, resumable.

Real filesystems and real processes: the run writes into a tmpfs too small for a
second copy of its checkpoint (an atomic write needs room for both), then the
tmpfs is grown, as freeing space would, and the run resumes.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CLI = [sys.executable, "-m", "rlvitals.cli"]
# 512-wide hidden layers: a checkpoint of about 6.1 MiB (network and Adam state).
BIG = ["--hidden-sizes", "512,512", "--num-envs", "4", "--rollout-length", "32", "--update-epochs", "1",
       "--num-minibatches", "1", "--checkpoint-interval", "1", "--verbosity", "minimal", "--progress", "false"]


@pytest.fixture
def tmpfs(tmp_path):
    """A 12 MiB tmpfs: room for one checkpoint and the run's small files, not for a second checkpoint."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mnt)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill ({proc.stderr.strip() or 'mount failed'}); needs root or "
                    "CAP_SYS_ADMIN. test_a_file_size_limit_* covers the same path without a mount")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1 and lines[0].startswith("rlvitals: error: "), stderr
    return lines[0]


def no_temporaries(run: Path) -> None:
    assert not [p for p in run.rglob("*") if p.name.endswith(".tmp")], "a temporary file was left behind"


def test_a_full_disk_ends_the_run_in_one_line_and_a_resume_works_once_space_is_freed(tmpfs):
    run = tmpfs / "run"
    proc = subprocess.run(CLI + ["train", "--total-env-steps", "100000", "--run-dir", str(run), *BIG],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    line = error_line(proc.stderr)
    assert f"no space left writing {run}/checkpoints/latest.pt" in line, line
    assert "MiB needed" in line and "free there" in line and "summary.json written" in line, line
    assert f"rlvitals train --resume {run}" in line, line
    no_temporaries(run)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and "no space left" in summary["archive_error"]
    assert summary["cause"].startswith("ArchiveWriteError: no space left writing"), summary["cause"]
    state = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)  # the last good one, whole
    assert f"last good checkpoint (update {state['tracker']['updates']}) kept" in line, line
    for row in (run / "metrics.jsonl").read_text().splitlines():
        json.loads(row)  # no torn row

    # Space freed (the tmpfs grown): the same run goes on from its checkpoint.
    subprocess.run(["mount", "-o", "remount,size=40m", str(tmpfs)], check=True)
    resumed = subprocess.run(CLI + ["train", "--resume", str(run), "--total-env-steps", "1500", "--progress",
                                    "false"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["status"] == "completed"
    no_temporaries(run)


def test_a_full_disk_under_tensorboard_is_the_same_one_line_and_leaves_no_temporary(tmpfs):
    """--tensorboard adds a writer of its own: its failure ends the run as any other write does (issue 21 item 7)."""
    run = tmpfs / "run"
    proc = subprocess.run(CLI + ["train", "--total-env-steps", "100000", "--run-dir", str(run), "--tensorboard", *BIG],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    line = error_line(proc.stderr)
    assert f"no space left writing {run}/" in line and "summary.json written" in line, line
    assert f"rlvitals train --resume {run}" in line, line
    no_temporaries(run)
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"


def _limit_file_size(limit: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_file_size_limit_on_the_first_checkpoint_is_one_line_with_the_summary_written(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run(CLI + ["train", "--total-env-steps", "100000", "--run-dir", str(run), *BIG],
                          capture_output=True, text=True, timeout=300, preexec_fn=_limit_file_size(2 * 2**20),
                          env={**os.environ})
    assert proc.returncode == 1, proc.stderr
    line = error_line(proc.stderr)
    assert f"no space left writing {run}/checkpoints/latest.pt" in line and "summary.json written" in line, line
    no_temporaries(run)
    assert not (run / "checkpoints" / "latest.pt").exists()
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"


APPEND = """
import json, resource, sys
from rlvitals.archive import ArchiveWriteError, RunArchive
archive = RunArchive.create(sys.argv[1], {"env": "CartPole-v1"}, ["test"])
resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))
written = 0
try:
    for i in range(1000):
        archive.append_metrics({"updates": i + 1, "padding": "x" * 100})
        written += 1
except ArchiveWriteError as exc:
    archive.append_metrics({"updates": -1, "padding": "x" * 100})  # after the failure: noted, not raised
    archive.write_summary({"status": "ArchiveWriteError"})
    print(json.dumps({"written": written, "error": str(exc)}))
archive.close()
"""


def test_a_metrics_row_that_does_not_fit_is_cut_back_whole(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", APPEND, str(run)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert 10 < result["written"] < 30
    assert f"writing {run}/metrics.jsonl" in result["error"] and "2 metrics rows not written" in result["error"]
    assert "summary.json written" in result["error"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["updates"] for r in rows] == list(range(1, result["written"] + 1)), "a torn or extra row"
    assert (run / "metrics.jsonl").read_bytes().endswith(b"\n")


EVENTS = """
import json, resource, sys
from rlvitals.archive import ArchiveWriteError, RunArchive
from rlvitals.report.tensorboard import TensorBoardWriter
from rlvitals.rows import RowWriter
archive = RunArchive.create(sys.argv[1], {"env": "CartPole-v1"}, ["test"])
rows = RowWriter(archive, [TensorBoardWriter(archive.path, flush_secs=0)], strict=False)
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
try:
    for i in range(1000):  # an event holds each value under a longer tag than the row's key: it fills first
        rows.write({"updates": i + 1, "env_steps": i, **{f"a_long_metric_name_{k}": 1.0 for k in range(30)}})
except ArchiveWriteError as exc:
    archive.write_summary({"status": "failed"})
    print(json.dumps({"rows": i, "error": str(exc)}))
archive.close()
"""


def test_an_event_file_that_does_not_fit_ends_the_run_through_the_archive(tmp_path):
    """The TensorBoard writer's failure is the archive's: raised once, in one line, with the summary written."""
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", EVENTS, str(run)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    result = json.loads(proc.stdout)
    assert 0 < result["rows"] < 1000, result
    assert f"writing {run}/events.out.tfevents." in result["error"], result["error"]
    assert "the events written before it kept" in result["error"] and "summary.json written" in result["error"]
    no_temporaries(run)


def test_a_disk_filled_by_the_runs_own_rows_and_events_still_takes_summary_and_verdicts(tmpfs):
    """1 MiB with 600 kB taken: metrics.jsonl or the event file fills it, not a checkpoint (issue 34). The room
    the run held back (archive/files.py RESERVE_BYTES) takes summary.json and verdicts.json; one line, exit 1."""
    subprocess.run(["mount", "-o", "remount,size=1m", str(tmpfs)], check=True)
    (tmpfs / "taken").write_bytes(b"\0" * 600_000)
    run = tmpfs / "run"
    proc = subprocess.run(CLI + ["train", "--total-env-steps", "10000000", "--run-dir", str(run), "--tensorboard",
                                 "--progress", "false"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    line = error_line(proc.stderr)
    assert f"no space left writing {run}/" in line and "needed" in line and "free there" in line, line
    assert "last good checkpoint (update" in line and "summary.json written" in line, line
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["archive_error"].startswith("no space left writing")
    json.loads((run / "verdicts.json").read_text())
    assert not (run / ".space-reserve").exists(), "the held room is given back when the run ends"
    no_temporaries(run)

    subprocess.run(["mount", "-o", "remount,size=4m", str(tmpfs)], check=True)
    resumed = subprocess.run(CLI + ["train", "--resume", str(run), "--total-env-steps",
                                    str(summary["env_steps"] + 1000), "--progress", "false"],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
