"""A run directory may come from a colleague, a tarball or a shared folder: every reader treats it as untrusted.

Real files, real symbolic links, FIFOs and devices, a real tmpfs where root may mount one, and the real
command in a subprocess. Each hostile case ends in one line (exit 2 for bad input, 1 for a full disk) or
in a page or table that notes what was skipped; nothing outside the run directory is written or deleted
(a canary behind every link survives byte for byte), and nothing is left behind.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cli import cli_env, finish, start

TESTS = Path(__file__).parent
SMALL = ["--num-envs", "4", "--rollout-length", "32", "--update-epochs", "1", "--num-minibatches", "2",
         "--verbosity", "off", "--progress", "false", "--total-env-steps", "256"]
CANARY = b"the user's own file: must survive byte for byte\n"
ROWS = 60


def rlv(args: list, cwd: Path, **env: str):
    return finish(start(args, cwd, cli_env(PYTHONPATH=f"{TESTS}{os.pathsep}{cwd}", **env)))


def one_line(result, code: int = 2) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rlvitals: error: "), result.stderr
    return lines[0]


def ok(result) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr


def canary(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    path = where / "precious.txt"
    path.write_bytes(CANARY)
    return path


def fake_run(path: Path, rows: list[dict] | None = None, summary: dict | None = None) -> Path:
    """A run directory as `rlvitals train` leaves it, written by hand (no training needed to read one)."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("env: CartPole-v1\nseed: 0\n")
    (path / "meta.json").write_text(json.dumps({"run_id": "abc123", "started_at": "2026-11-26T08:00:00+0000"}))
    rows = rows if rows is not None else [{"updates": i, "env_steps": 128 * i, "wall_seconds": 0.5 * i,
                                           "loss": 1.0 / i, "return_mean": float(i)} for i in range(1, ROWS + 1)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text(json.dumps(summary or {"status": "completed", "env_steps": 128 * ROWS,
                                                              "mean_return_last_100": 20.0}))
    return path


def leftovers(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.startswith(".tensorboard-export") or ".tmp" in p.name)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One short real CartPole run (its checkpoints, lock and discovery as train leaves them)."""
    home = tmp_path_factory.mktemp("trained")
    result = rlv(["train", "--run-dir", home / "run", *SMALL], home)
    assert result.returncode == 0, result.stderr
    return home / "run"


def copy_of(trained: Path, where: Path) -> Path:
    return Path(shutil.copytree(trained, where / "run", symlinks=True))


# ------------------------------------------------------------------ 1, 6: export tensorboard
def _link_staging(run: Path, target: Path) -> None:
    (run / ".tensorboard-export").symlink_to(target, target_is_directory=True)


def _file_staging(run: Path, target: Path) -> None:
    (run / ".tensorboard-export").write_text("a file where the staging folder was\n")


def _staging_with_folder(run: Path, target: Path) -> None:
    (run / ".tensorboard-export" / "inner").mkdir(parents=True)


@pytest.mark.parametrize("plant", [_link_staging, _file_staging, _staging_with_folder],
                         ids=["staging-is-a-link-to-the-users-folder", "staging-is-a-file", "staging-holds-a-folder"])
def test_export_never_deletes_through_a_planted_staging_folder(tmp_path, plant):
    run = fake_run(tmp_path / "run")
    precious = canary(tmp_path / "users-folder")
    plant(run, precious.parent)
    result = run_export(run, tmp_path)
    ok(result)
    assert precious.read_bytes() == CANARY and sorted(os.listdir(precious.parent)) == ["precious.txt"]
    assert json.loads(result.stdout)["rows"] == ROWS
    assert [p.name for p in run.glob("events.out.tfevents.*")] == [Path(json.loads(result.stdout)["tensorboard"]).name]
    assert [n for n in leftovers(run) if n != ".tensorboard-export"] == [], "a staging folder was left"


def run_export(run: Path, cwd: Path):
    return rlv(["export", "tensorboard", run], cwd)


@pytest.mark.parametrize("kind", ["link", "folder"])
def test_export_refuses_an_event_file_that_is_a_link_or_a_folder_before_writing(tmp_path, kind):
    run = fake_run(tmp_path / "run")
    precious = canary(tmp_path / "users-folder")
    planted = run / "events.out.tfevents.1700000000.elsewhere"
    if kind == "link":
        planted.symlink_to(precious)
    else:
        planted.mkdir()
    before = sorted(os.listdir(run))
    line = one_line(run_export(run, tmp_path))
    assert planted.name in line and ("symbolic link" if kind == "link" else "not a regular file") in line, line
    assert precious.read_bytes() == CANARY
    assert sorted(os.listdir(run)) == before, "nothing may be written when the export is refused"


def test_export_of_a_run_without_rows_is_one_line_and_leaves_nothing(tmp_path):
    run = fake_run(tmp_path / "run", rows=[])
    before = sorted(os.listdir(run))
    line = one_line(run_export(run, tmp_path))
    assert "no metrics rows yet" in line, line
    assert sorted(os.listdir(run)) == before


def test_export_refuses_a_run_whose_writer_is_alive(tmp_path):
    """A live `train --tensorboard` writes its event file: an export replacing it would lose its rows."""
    run = fake_run(tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
                               "from rlvitals.archive import lock_run_dir\nlock_run_dir(Path(sys.argv[1]))\n"
                               "print('locked', flush=True)\ntime.sleep(600)", run], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        line = one_line(run_export(run, tmp_path))
        assert "in use by process" in line, line
        assert not list(run.glob("events.out.tfevents.*"))
    finally:
        holder.kill()
        holder.wait()


@pytest.fixture
def tmpfs(tmp_path):
    """A small real tmpfs (root only): grown, filled or made read-only by the test."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs ({proc.stderr.strip() or 'mount failed'}); needs root or CAP_SYS_ADMIN")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_export_into_a_read_only_run_directory_is_one_line(tmpfs, tmp_path):
    run = fake_run(tmpfs / "run")
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    line = one_line(run_export(run, tmp_path))
    assert "not writable" in line and str(run) in line, line


def _fill(mnt: Path, leave: int) -> None:
    """Fill the tmpfs to within `leave` bytes of full."""
    free = shutil.disk_usage(mnt).free
    with open(mnt / "filler", "wb") as fh:
        fh.write(b"\0" * max(free - leave, 0))


def test_export_on_a_full_disk_is_one_line_and_leaves_the_run_as_it_was(tmpfs, tmp_path):
    rows = [{"updates": i, "env_steps": 128 * i, "wall_seconds": 0.5 * i, **{f"key_{k}": 1.0 * k for k in range(20)}}
            for i in range(1, 2001)]
    run = fake_run(tmpfs / "run", rows=rows)
    old = run / "events.out.tfevents.1700000000.earlier"
    old.write_bytes(b"an earlier export\n")
    _fill(tmpfs, leave=64 * 1024)  # an event file of 2,000 rows of 23 scalars needs far more
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    line = one_line(run_export(run, tmp_path), code=1)
    assert "no space left writing" in line and "free there" in line and "the partial export removed" in line, line
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert leftovers(run) == []


def test_report_without_output_on_a_full_disk_names_the_file_not_none(tmpfs, tmp_path):
    run = fake_run(tmpfs / "run")
    _fill(tmpfs, leave=16 * 1024)  # the page is megabytes (plotly is inlined)
    result = finish(start(["report", run], tmp_path))
    line = one_line(result, code=1)
    assert f"no space left writing {run}/report.html" in line and "None" not in line, line
    assert leftovers(run) == [] and not (run / "report.html").exists()


# ------------------------------------------------------------------ 2: the lock
@pytest.mark.parametrize("dangling", [False, True], ids=["link-to-the-users-file", "dangling-link"])
def test_resume_never_writes_through_a_symlinked_lock(trained, tmp_path, dangling):
    run = copy_of(trained, tmp_path)
    precious = canary(tmp_path / "home")
    target = precious.parent / "not-yet-there" if dangling else precious
    (run / ".lock").unlink()
    (run / ".lock").symlink_to(target)
    line = one_line(rlv(["train", "--resume", run, "--total-env-steps", "512"], tmp_path))
    assert ".lock is a symbolic link" in line, line
    assert precious.read_bytes() == CANARY and not (precious.parent / "not-yet-there").exists()


@pytest.mark.parametrize("name", ["metrics.jsonl", "checkpoints", "discovery"])
def test_resume_never_writes_through_any_link_in_the_run(trained, tmp_path, name):
    """A resume truncates metrics.jsonl, places checkpoints and removes discovery files: none through a link."""
    run = copy_of(trained, tmp_path)
    precious = canary(tmp_path / "home")
    entry = run / name
    if name != "metrics.jsonl":  # a folder: moved out (discovery/ is made at verbosity minimal and up)
        if entry.is_dir():
            shutil.move(entry, precious.parent / name)
        else:
            (precious.parent / name).mkdir()
        entry.symlink_to(precious.parent / name, target_is_directory=True)
        (precious.parent / name / "precious.json").write_bytes(CANARY)  # what a cleanup would remove
    else:
        entry.unlink()
        entry.symlink_to(precious)
    before = {p: p.read_bytes() for p in precious.parent.rglob("*") if p.is_file()}
    line = one_line(rlv(["train", "--resume", run, "--total-env-steps", "512"], tmp_path))
    assert f"{name} is a symbolic link" in line, line
    assert {p: p.read_bytes() for p in precious.parent.rglob("*") if p.is_file()} == before


# ------------------------------------------------------------------ 3: YAML in a run directory
def alias_bomb() -> str:
    levels = ["&a0 [" + ", ".join(["lol"] * 9) + "]"]
    levels += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    return "env: CartPole-v1\nenv_kwargs: {x: [\n" + ",\n".join(f"  {level}" for level in levels) + "]}\n"


HOSTILE_YAML = {
    "alias-bomb": (alias_bomb(), "alias"),
    "recursive-alias": ("env: &e [CartPole-v1, *e]\n", "alias"),
    "duplicate-key": ("env: CartPole-v1\nseed: 1\nseed: 2\n", "appears twice"),
    "nested-3000-deep": ("env: CartPole-v1\nenv_kwargs: {x: " + "[" * 3000 + "]" * 3000 + "}\n", "nested"),
}


@pytest.mark.parametrize("case", list(HOSTILE_YAML))
def test_every_reader_of_config_yaml_refuses_what_train_config_refuses(trained, tmp_path, case):
    text, why = HOSTILE_YAML[case]
    run = copy_of(trained, tmp_path)
    (run / "config.yaml").write_text(text)
    fake_run(tmp_path / "other-run")

    began = time.monotonic()
    report = finish(start(["report", run, "-o", tmp_path / "report.html"], tmp_path))
    ok(report)
    page = (tmp_path / "report.html").read_text()
    assert why in page and "config.yaml" in page

    table = finish(start(["runs", tmp_path], tmp_path))
    ok(table)
    assert "other-run" in table.stdout and len(table.stdout) < 10_000, "one bad run never loses the table"
    assert str(run) in table.stderr and why in table.stderr, table.stderr

    resumed = one_line(rlv(["train", "--resume", run, "--total-env-steps", "512"], tmp_path))
    assert "config.yaml" in resumed and why in resumed, resumed
    assert time.monotonic() - began < 300, "nothing may expand the YAML (a bomb takes hours)"

    config = tmp_path / "config.yaml"
    config.write_text(text)
    line = one_line(rlv(["train", "--config", config, "--run-dir", tmp_path / "new"], tmp_path))
    assert why in line, line
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------------ 4: the page's scripts
SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)


def test_a_run_name_or_metric_key_holding_script_markup_cannot_break_the_page(tmp_path):
    hostile = "<!--<script>"
    rows = [{"updates": i, "env_steps": 128 * i, "wall_seconds": 0.5 * i, "loss": 1.0 / i, f"x{hostile}</script>": i}
            for i in range(1, 30)]
    run = fake_run(tmp_path / f"run{hostile}", rows=rows)
    ok(finish(start(["report", run, "-o", tmp_path / "report.html"], tmp_path)))
    page = (tmp_path / "report.html").read_text()
    scripts = SCRIPT.findall(page)
    plots = [s for s in scripts if s.startswith("Plotly.newPlot(")]
    assert plots and len(plots) == page.count('class="plot"'), "every plot's script must be whole"
    for script in plots:
        assert "<" not in script, script[:200]
        args = script[script.index(",") + 1: script.rindex(");")]
        json.loads(f"[{args}]")  # still the JSON it was
    assert f"x{hostile}</script>".replace("<", "\\u003c").replace(">", "\\u003e") in "".join(plots)
    assert "id='config'" in page and "id='reference'" in page, "later sections must still be there"


# ------------------------------------------------------------------ 5: hostile values
def hostile_values_run(path: Path) -> Path:
    rows = [{"updates": i, "env_steps": 128 * i, "wall_seconds": 0.5 * i, "loss": 1.0 / i} for i in range(1, 40)]
    rows[5]["loss"] = int("9" * 400)
    rows[6]["wall_seconds"] = "x"
    rows[7]["env_steps"] = "many"
    rows[8]["updates"] = {"nested": [1, 2]}
    rows[9]["target_hist"] = [["a", int("9" * 400)], "x"]
    run = fake_run(path, rows=rows, summary={"status": "completed", "mean_return_last_100": int("9" * 400),
                                             "wall_seconds": "x", "env_steps": [1], "samples": {"dropped": "x"}})
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write("1" * 5000 + "\n")  # beyond Python's integer digits limit
        fh.write("[" * 100_000 + "\n")  # beyond its recursion limit
    (run / "meta.json").write_text(json.dumps({"run_id": 5, "command": 7, "code_version": "x", "hostname": ["h"]}))
    (run / "config.yaml").write_text(f"env: CartPole-v1\nseed: {'9' * 400}\n")
    (run / "verdicts.json").write_text(json.dumps([
        {"rule": 5, "severity": ["critical"], "component": None, "first_seconds": "soon", "message": {}},
        {"rule": "r", "severity": "warning", "component": "learner", "first_seconds": int("9" * 400)},
        "not a verdict",
        {"rule": "kept", "severity": "info", "component": "learner", "first_seconds": 1.0, "message": "fine"},
    ]))
    return run


def test_hostile_values_are_skipped_and_noted_by_every_reader(tmp_path):
    run = hostile_values_run(tmp_path / "runs" / "hostile")
    fake_run(tmp_path / "runs" / "fine")

    report = finish(start(["report", run, "-o", tmp_path / "report.html"], tmp_path))
    ok(report)
    page = (tmp_path / "report.html").read_text()
    assert "were no usable number" in page and "did not parse" in page and "not verdicts" in page
    assert "of summary.json were of the wrong type" in page and "field(s) of meta.json" in page

    table = finish(start(["runs", tmp_path / "runs", "--json"], tmp_path))
    ok(table)
    listed = {row["run"]: row for row in json.loads(table.stdout)}
    assert set(listed) == {"hostile", "fine"}, "one bad run never loses the table"
    assert listed["hostile"]["final_return"] is None and listed["hostile"]["wall_seconds"] is None
    ok(finish(start(["runs", tmp_path / "runs", "--sort", "final_return"], tmp_path)))

    exported = finish(start(["export", "tensorboard", run], tmp_path))
    ok(exported)
    assert json.loads(exported.stdout)["rows"] == 39

    from rlvitals.telemetry.health import evaluate_run
    evaluate_run(run)  # no OverflowError, no TypeError


# ------------------------------------------------------------------ 9, 10: eval of a checkpoint from anywhere
IMPORT_MARK = """
import os
from pathlib import Path
Path(os.environ["MARK"]).write_text("imported")
import gymnasium as gym
gym.register("Marked-v0", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv")
"""


def test_a_checkpoint_never_makes_eval_or_load_policy_import_its_module(tmp_path):
    (tmp_path / "marked_env.py").write_text(IMPORT_MARK)
    mark = tmp_path / "imported"
    trained = rlv(["train", "--env", "marked_env:Marked-v0", "--run-dir", tmp_path / "run", *SMALL], tmp_path,
                  MARK=str(mark))
    assert trained.returncode == 0, trained.stderr
    mark.unlink()
    ckpt = tmp_path / "run" / "checkpoints" / "latest.pt"

    line = one_line(rlv(["eval", "--checkpoint", ckpt, "--episodes", "1"], tmp_path, MARK=str(mark)))
    assert "'marked_env'" in line and "--env marked_env:Marked-v0" in line, line
    assert not mark.exists(), "the module was imported"
    script = ("import sys, rlvitals\ntry:\n    rlvitals.load_policy(None, sys.argv[1])\nexcept ValueError as e:\n"
              "    print('refused', e)\n")
    refused = subprocess.run([sys.executable, "-c", script, ckpt], capture_output=True, text=True, cwd=tmp_path,
                             env=cli_env(PYTHONPATH=str(tmp_path), MARK=str(mark)), timeout=300)
    assert refused.stdout.startswith("refused") and not mark.exists(), refused.stdout + refused.stderr

    line = one_line(rlv(["eval", "--checkpoint", ckpt, "--env", "CartPole-v1"], tmp_path, MARK=str(mark)))
    assert "trained on env 'marked_env:Marked-v0'" in line and not mark.exists(), line

    named = rlv(["eval", "--checkpoint", ckpt, "--episodes", "1", "--env", "marked_env:Marked-v0"], tmp_path,
                MARK=str(mark))
    ok(named)
    assert mark.exists(), "named on the command line, the module is imported"


def test_eval_refuses_another_runs_checkpoint_beside_a_run_directory(trained, tmp_path):
    other = copy_of(trained, tmp_path / "a")
    meta = json.loads((other / "meta.json").read_text())
    meta["run_id"] = "another0run0"
    (other / "meta.json").write_text(json.dumps(meta))
    line = one_line(rlv(["eval", "--run-dir", other, "--checkpoint", trained / "checkpoints" / "latest.pt",
                         "--episodes", "1"], tmp_path))
    assert "belongs to run" in line and "another0run0" in line, line


# ------------------------------------------------------------------ 11: unbounded reads
def test_no_reader_blocks_on_a_fifo_or_reads_a_device(trained, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for source in ("/dev/zero", fifo):
        line = one_line(rlv(["train", "--config", source, "--run-dir", tmp_path / "new"], tmp_path))
        assert "not a regular file" in line, line
        line = one_line(rlv(["eval", "--checkpoint", source], tmp_path))
        assert "not a regular file" in line, line
    big = tmp_path / "big.yaml"
    big.write_text("seed: 1\n" + "# padding\n" * 300_000)
    assert "at most 1.0 MB" in one_line(rlv(["train", "--config", big, "--run-dir", tmp_path / "new"], tmp_path))
    assert not (tmp_path / "new").exists()

    run_dir = copy_of(trained, tmp_path / "copy")
    (run_dir / "metrics.jsonl").unlink()
    os.mkfifo(run_dir / "metrics.jsonl")
    ok(finish(start(["report", run_dir, "-o", tmp_path / "report.html"], tmp_path)))
    assert "metrics.jsonl could not be read" in (tmp_path / "report.html").read_text()
    assert "metrics.jsonl cannot be read" in one_line(finish(start(["export", "tensorboard", run_dir], tmp_path)))


# ------------------------------------------------------------------ 12: memory of the report
MEASURE = """
import re, sys
from rlvitals.cli import main
code = main(["report", sys.argv[1], "-o", sys.argv[2]])
status = open("/proc/self/status").read()  # VmHWM: this process's own peak (ru_maxrss counts the forking parent's)
print(code, int(re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1)) * 1024)
"""


def test_report_memory_does_not_grow_with_the_length_of_the_run(tmp_path):
    """Peak memory of a report of a run and of one 4x as long (4x the metrics.jsonl): the same within a margin
    far below the added file size, so the rows are never all held."""
    peaks = {}
    for n in (20_000, 80_000):
        rows = [{"updates": i, "env_steps": 128 * i, "wall_seconds": 2.0 * i, "loss": 1.0 / i,
                 "padding": "p" * 200} for i in range(1, n + 1)]
        run = fake_run(tmp_path / f"run-{n}", rows=rows)
        done = subprocess.run([sys.executable, "-c", MEASURE, run, tmp_path / f"{n}.html"], capture_output=True,
                              text=True, timeout=900, cwd=tmp_path, env=cli_env())
        code, peak = done.stdout.splitlines()[-1].split()
        assert code == "0", done.stderr
        peaks[n] = (int(peak), (run / "metrics.jsonl").stat().st_size)
    grown = peaks[80_000][0] - peaks[20_000][0]
    added = peaks[80_000][1] - peaks[20_000][1]
    assert grown < added / 4, f"peak memory grew {grown / 2**20:.0f} MiB for {added / 2**20:.0f} MiB more rows {peaks}"


# ------------------------------------------------------------------ 13: permissions and a run killed early
def test_report_and_event_files_take_the_run_directorys_permissions(tmp_path):
    run = fake_run(tmp_path / "run")
    os.chmod(run, 0o700)
    old = os.umask(0o022)
    try:
        ok(finish(start(["report", run], tmp_path)))
        ok(finish(start(["export", "tensorboard", run], tmp_path)))
    finally:
        os.umask(old)
    for path in [run / "report.html", *run.glob("events.out.tfevents.*")]:
        assert (path.stat().st_mode & 0o777) == 0o600, (path, oct(path.stat().st_mode))


def test_a_run_killed_before_its_first_checkpoint_is_cleaned_by_resume(tmp_path):
    run = fake_run(tmp_path / "run", rows=[])
    (run / "summary.json").unlink()
    (run / "discovery").mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    target = run / "discovery" / f"local-{dead.pid}-9100.json"
    target.write_text('[{"targets": ["127.0.0.1:9100"]}]')
    line = one_line(rlv(["train", "--resume", run, "--total-env-steps", "512"], tmp_path))
    assert "nothing to resume" in line and target.name in line, line
    assert not target.exists()


def test_resources_are_bounded_in_cpu_time(tmp_path):
    """The alias bomb of a run's config.yaml in `report` is refused, not expanded: bounded CPU time."""
    run = fake_run(tmp_path / "run")
    (run / "config.yaml").write_text(alias_bomb())
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    ok(finish(start(["report", run, "-o", tmp_path / "r.html"], tmp_path)))
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - before < 120
