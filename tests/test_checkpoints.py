"""checkpoints/: latest.pt, best.pt and the last keep_checkpoints update-<N>.pt; `rlvitals eval --checkpoint`.

The archive's rules on real files (which checkpoint is best, what is pruned, what a resume puts back),
then a real CartPole run and its resume through the command, and eval of its checkpoints by name and path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlvitals.archive import RunArchive, checkpoint_names
from rlvitals.archive.checkpoints import prune_updates

CLI = [sys.executable, "-m", "rlvitals.cli"]
SMALL = ["--num-envs", "4", "--rollout-length", "32", "--update-epochs", "1", "--num-minibatches", "2",
         "--verbosity", "off", "--progress", "false"]


def cli(*args, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, timeout=timeout)


def load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def files(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


# ------------------------------------------------------------------ the archive's rules, on real files
def write(archive: RunArchive, updates: int, mean_return: float | None) -> None:
    archive.save_checkpoint({"tracker": {"updates": updates}, "payload": torch.full((3,), float(updates))},
                            mean_return=mean_return)


def test_best_is_the_highest_mean_return_so_far_and_the_last_k_update_files_are_kept(tmp_path):
    archive = RunArchive.create(str(tmp_path / "run"), {"keep_checkpoints": 2}, ["test"])
    folder = archive.path / "checkpoints"
    expected_best = {1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4}
    # No episode yet (None) is beaten by any mean; a tie keeps the earlier; a lower mean never wins.
    for updates, mean in [(1, None), (2, 5.0), (3, 3.0), (4, 7.0), (5, 7.0), (6, 2.0)]:
        write(archive, updates, mean)
        assert load(folder / "best.pt")["tracker"]["updates"] == expected_best[updates], f"after update {updates}"
        kept = [u for u in (updates - 1, updates) if u >= 1]
        assert files(archive.path) == sorted(["best.pt", "latest.pt", *(f"update-{u}.pt" for u in kept)])
        assert (folder / "latest.pt").samefile(folder / f"update-{updates}.pt"), "a hard link, not a second copy"
    assert load(folder / "latest.pt")["best"] == {"updates": 4, "mean_return_last_100": 7.0}
    assert archive.checkpoints_written == 6 and not list(folder.glob(".*.tmp"))
    archive.close()


def test_the_final_checkpoint_of_the_same_update_replaces_best_and_its_update_file(tmp_path):
    archive = RunArchive.create(str(tmp_path / "run"), {"keep_checkpoints": 3}, ["test"])
    folder = archive.path / "checkpoints"
    write(archive, 8, 20.0)
    write(archive, 8, 20.0)  # the run ended right after a periodic checkpoint: finish writes update 8 again
    assert files(archive.path) == ["best.pt", "latest.pt", "update-8.pt"]
    assert (folder / "best.pt").samefile(folder / "latest.pt") and (folder / "latest.pt").stat().st_nlink == 3
    archive.close()


def test_keep_0_keeps_only_latest_and_best_and_pruning_leaves_other_files_alone(tmp_path):
    archive = RunArchive.create(str(tmp_path / "run"), {"keep_checkpoints": 0}, ["test"])
    folder = archive.path / "checkpoints"
    for name in ("update-3.pt", "update-12.pt", "update-7.pt.bak", "notes.txt"):
        (folder / name).write_bytes(b"older")
    write(archive, 20, 10.0)
    write(archive, 21, 4.0)
    assert files(archive.path) == ["best.pt", "latest.pt", "notes.txt", "update-7.pt.bak"]
    assert [load(folder / name)["tracker"]["updates"] for name in ("best.pt", "latest.pt")] == [20, 21]
    archive.close()
    (folder / "update-100.pt").write_bytes(b"x")
    (folder / "update-99.pt").write_bytes(b"x")
    assert prune_updates(folder, 1) == ["update-99.pt"], "by update number, not by name"
    assert checkpoint_names(folder) == ["latest", "best", "update-100"]


def test_a_resume_puts_back_best_and_the_update_file_a_kill_left_unplaced(tmp_path):
    """A kill after latest.pt was renamed into place but before best.pt and update-<N>.pt were linked to it."""
    archive = RunArchive.create(str(tmp_path / "run"), {"keep_checkpoints": 2}, ["test"])
    folder = archive.path / "checkpoints"
    write(archive, 1, 1.0)
    write(archive, 2, 9.0)
    archive.close()
    shutil.copy(folder / "update-1.pt", folder / "best.pt.old")
    os.replace(folder / "best.pt.old", folder / "best.pt")  # best.pt still the earlier one
    (folder / "update-2.pt").unlink()
    state = load(folder / "latest.pt")
    assert state["best"]["updates"] == 2

    resumed = RunArchive(archive.path)
    resumed.note_resume(["test"], 0, {"keep_checkpoints": 1}, updates=2, best=state["best"])
    assert (folder / "best.pt").samefile(folder / "latest.pt")
    assert (folder / "update-2.pt").samefile(folder / "latest.pt")
    assert files(archive.path) == ["best.pt", "latest.pt", "update-2.pt"], "keep_checkpoints=1 of the resume applied"
    write(resumed, 3, 5.0)  # judged against the record: 5 < 9, best stays at update 2
    assert load(folder / "best.pt")["tracker"]["updates"] == 2
    resumed.close()

    again = RunArchive(archive.path)  # nothing to put back: every file already in place
    again.note_resume(["test"], 0, {"keep_checkpoints": 1}, updates=3, best=load(folder / "latest.pt")["best"])
    again.close()
    assert files(archive.path) == ["best.pt", "latest.pt", "update-3.pt"], "a temporary or a lost file"


# ------------------------------------------------------------------ a real run, its resume, and eval
EVERY = 2
"""Updates between checkpoints of the run below (--checkpoint-interval 4, 2 learner steps per update)."""


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory) -> tuple[Path, int]:
    """CartPole with a checkpoint every 2 updates, 2 update files kept, resumed once with 1 kept: (run, the
    update the first part ended at)."""
    run = tmp_path_factory.mktemp("checkpoints") / "run"
    first = cli("train", "--total-env-steps", 1024, "--run-dir", run, "--checkpoint-interval", 4,
                "--keep-checkpoints", 2, *SMALL)
    assert first.returncode == 0, first.stderr
    ended = json.loads(first.stdout.strip().splitlines()[-1])["updates"]
    previous = max(u for u in range(1, ended) if u % EVERY == 0)
    assert files(run) == sorted(["best.pt", "latest.pt", f"update-{ended}.pt", f"update-{previous}.pt"])
    resumed = cli("train", "--resume", run, "--total-env-steps", 2048, "--keep-checkpoints", 1, "--progress", "false")
    assert resumed.returncode == 0, resumed.stderr
    return run, ended


@pytest.fixture(scope="module")
def run(resumed_run) -> Path:
    return resumed_run[0]


@pytest.mark.slow
def test_a_run_keeps_latest_best_and_its_newest_update_file_through_a_resume(resumed_run):
    run, first_ended = resumed_run
    summary = json.loads((run / "summary.json").read_text())
    folder = run / "checkpoints"
    assert files(run) == ["best.pt", "latest.pt", f"update-{summary['updates']}.pt"]
    assert load(folder / "latest.pt")["tracker"]["updates"] == summary["updates"]
    # best.pt: of the checkpoints written (every 2 updates, and at the end of each part), the first with the
    # highest mean return over the last 100 episodes; the rows hold that mean at every update.
    rows = {row["updates"]: row for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    written = [u for u in sorted(rows) if u % EVERY == 0 or u in (first_ended, summary["updates"])]
    assert len(written) >= 8 and all("mean_return_last_100" in rows[u] for u in written)
    highest = max(rows[u]["mean_return_last_100"] for u in written)
    best = load(folder / "best.pt")
    assert best["best"]["updates"] == best["tracker"]["updates"]
    assert best["best"]["mean_return_last_100"] == pytest.approx(highest)
    assert best["tracker"]["updates"] == min(u for u in written if rows[u]["mean_return_last_100"] == highest)


@pytest.mark.slow
def test_eval_takes_a_checkpoint_by_name_or_path_and_acts_greedily_unless_asked_to_sample(run):
    best = load(run / "checkpoints" / "best.pt")["tracker"]["updates"]
    latest = load(run / "checkpoints" / "latest.pt")["tracker"]["updates"]
    path = run / "checkpoints" / f"update-{latest}.pt"
    calls = {"best": ["--run-dir", run, "--checkpoint", "best"],
             "path, sampled": ["--checkpoint", path, "--sample"],
             "latest, --greedy": ["--run-dir", run, "--greedy"]}
    procs = {name: subprocess.Popen(CLI + ["eval", "--episodes", "2", *map(str, args)], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for name, args in calls.items()}
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        results[name] = json.loads(out)
    assert (results["best"]["checkpoint"], results["best"]["checkpoint_updates"]) == \
        (str(run / "checkpoints" / "best.pt"), best)
    assert results["best"]["greedy"] is True and results["best"]["run_dir"] == str(run)
    assert (results["path, sampled"]["checkpoint"], results["path, sampled"]["checkpoint_updates"]) == \
        (str(path), latest)
    assert results["path, sampled"]["greedy"] is False and results["path, sampled"]["run_dir"] is None
    assert results["latest, --greedy"]["greedy"] is True
    assert results["latest, --greedy"]["checkpoint"] == str(run / "checkpoints" / "latest.pt")
