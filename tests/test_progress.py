"""The progress display: fits the terminal it is drawn on, plain lines elsewhere, honest at the end.

Real pseudo-terminals (Python's `pty`, sized with TIOCSWINSZ), the real `rlvitals train` in a subprocess,
a real Ray for Ray mode.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from rlvitals.progress import NARROWING, ProgressLine, Reading, break_line, field_forms, fit

CLI = [sys.executable, "-m", "rlvitals.cli", "train"]
# A redraw after every update (an interval no update is shorter than): how many there are does not hang on
# how fast this machine runs the updates.
SHORT = ["--env", "CartPole-v1", "--total-env-steps", "30000", "--verbosity", "off", "--log-interval-seconds", "1e-9"]
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PROGRESS = re.compile(r"^\s*(\d+)%  ")
STATS = {"relative_entropy": 0.93, "kl": 0.0123, "residual_variance": 0.41}


def set_columns(fd: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))


def visible_lines(text: str) -> list[str]:
    """What a terminal shows line by line, at most: split on carriage returns and newlines, escape codes removed."""
    return [part for part in re.split(r"[\r\n]", ESCAPE.sub("", text)) if part.strip()]


def read_all(master: int) -> bytes:
    """What is waiting on a pseudo-terminal's master side (it comes in pieces)."""
    chunks = []
    while select.select([master], [], [], 0.2)[0]:
        chunks.append(os.read(master, 65536))
    return b"".join(chunks)


def in_terminal(args: list[str], columns: int, cwd: Path, timeout: float = 240) -> tuple[int, str]:
    """Run `args` with stdout and stderr on a new pseudo-terminal `columns` wide; (exit code, all it wrote)."""
    master, slave = pty.openpty()
    set_columns(slave, columns)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # the width comes from the tty
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, cwd=cwd, env=env)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer of the terminal has closed it
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(master)
    return proc.returncode, b"".join(chunks).decode(errors="replace")


# ------------------------------------------------------------------ the line itself
def test_every_width_gets_a_line_that_fits_and_keeps_the_progress():
    forms = field_forms(Reading(43_210, 12.0, 187.25, STATS, 96), 100_000, 25_734.0, final=False)
    full, _ = fit(forms, None)
    assert all(word in full for word in ("43%", "[##########", "43,210/100,000 steps", "25,734 steps/s",
                                         "return 187.2", "ent 0.93", "kl 1.2e-02", "resvar 0.41", "age 96", "eta 2s"))
    for width in range(16, len(full) + 10):  # 16: " 43%  43.2k/100k", the narrowest whole form
        line, steps = fit(forms, width)
        assert len(line) <= width, (width, line)
        assert line.startswith(" 43%") and ("43,210/100,000" in line or "43.2k/100k" in line), (width, line)
        assert steps == 0 or len(fit(forms, None, steps - 1)[0]) > width, "narrowed more than it had to"
    assert fit(forms, 79)[0] == " 43%  43,210/100,000  25.7k/s  ret 187.2  ent 0.93  kl 1.2e-02  eta 2s"
    assert fit(forms, 4)[0] == " 43%", "narrower than every form: cut, never wider"
    assert fit(forms, 200) == (full, 0)
    assert len(NARROWING) == len({(name, form) for name, form in NARROWING})


def test_the_end_never_claims_more_than_100_percent_nor_a_negative_eta():
    overshoot = Reading(101_523, 30.0, 480.0, STATS, 800)
    running, _ = fit(field_forms(overshoot, 100_000, 3_000.0, final=False), None)
    final, _ = fit(field_forms(overshoot, 100_000, 3_000.0, final=True), None)
    assert running.startswith("100%") and "101,523 steps" in running and "/100,000" not in running
    assert "eta 0s" in running, running
    assert final.startswith("100%") and "101,523 steps" in final and "took 30s" in final and "eta" not in final
    nearly = fit(field_forms(Reading(99_990, 30.0, None, {}, 0), 100_000, None, final=False), None)[0]
    assert nearly.startswith(" 99%") and "99,990/100,000" in nearly and "eta -" in nearly and "return -" in nearly
    stopped = fit(field_forms(Reading(40_000, 9.0, 20.0, {}, 0), 100_000, 4_000.0, final=True), None)[0]
    assert stopped.startswith(" 40%") and "40,000/100,000 steps" in stopped and "took 9s" in stopped


def test_redrawn_in_place_to_the_terminals_width_now_and_plain_lines_elsewhere():
    master, slave = pty.openpty()
    set_columns(slave, 80)
    terminal = os.fdopen(slave, "w", encoding="utf-8")
    try:
        line = ProgressLine(100_000, stream=terminal, interval=0)
        assert line.in_place
        for i in range(1, 4):
            line.update(Reading(i * 10_000, float(i), 20.0 * i, STATS, i))
        # A message printed now (a stop signal's) starts on a new line, once; the next redraw is below it.
        assert (break_line(), break_line()) == ("\n", "")
        set_columns(slave, 40)  # the window is made narrower during the run
        line.update(Reading(50_000, 5.0, 120.0, STATS, 5))
        line.finish(Reading(100_096, 9.5, 300.0, STATS, 9))
        drawn = read_all(master).decode()
    finally:
        terminal.close()
        os.close(master)
    parts = [p.rstrip("\n") for p in drawn.split("\r") if PROGRESS.match(p)]
    assert "\x1b" not in drawn and len(parts) == 5, repr(drawn)
    assert all(len(p) <= 79 for p in parts[:3]) and all(len(p) <= 39 for p in parts[3:]), parts
    assert parts[-1].startswith("100%  100,096") and "took 10s" in parts[-1], repr(drawn)
    assert drawn.endswith("\n") and break_line() == "", "the final line is ended: nothing to break"

    notebook = io.StringIO()  # not a terminal, as a Jupyter notebook's output or a log file is
    plain = ProgressLine(100_000, stream=notebook, interval=0, plain_interval=3600)
    for i in range(1, 4):
        plain.update(Reading(i * 10_000, float(i), 20.0, STATS, i))
    plain.finish(Reading(100_096, 9.5, 300.0, STATS, 9))
    lines = notebook.getvalue().splitlines()
    assert "\r" not in notebook.getvalue() and "\x1b" not in notebook.getvalue()
    assert len(lines) == 2 and lines[0].startswith(" 10%  [##") and lines[1].startswith("100%  [####"), lines


# ------------------------------------------------------------------ the real command
@pytest.mark.slow
def test_a_local_run_in_an_80_column_terminal_redraws_one_line_that_fits(tmp_path):
    code, text = in_terminal([*CLI, *SHORT, "--run-dir", "run"], 80, tmp_path)
    assert code == 0, text[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    display = text[: text.index('{"algorithm"')]  # what the progress display drew, before the JSON summary
    assert "\x1b" not in display, repr(display)
    lines = visible_lines(display)
    redraws = [p for p in display.split("\r")[1:] if PROGRESS.match(p)]
    assert len(redraws) >= summary["updates"] >= 3, repr(display)  # a redraw per update, each in place
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    assert all(int(PROGRESS.match(p).group(1)) <= 100 for p in redraws) and "eta -" not in display
    assert display.count("\n") <= 1, "a redraw went to a new line"
    final = redraws[-1]
    assert final.startswith("100%") and f"{summary['env_steps']:,}" in final and "took" in final, final


@pytest.mark.slow
def test_piped_to_a_file_the_progress_is_plain_lines(tmp_path):
    with open(tmp_path / "log", "w") as log:
        proc = subprocess.run([*CLI, *SHORT, "--run-dir", str(tmp_path / "run")], stdout=subprocess.DEVNULL,
                              stderr=log, timeout=240)
    text = (tmp_path / "log").read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "\r" not in text and "\x1b" not in text, repr(text)
    progress = [line for line in text.splitlines() if PROGRESS.match(line)]
    steps = json.loads((tmp_path / "run" / "summary.json").read_text())["env_steps"]
    assert len(progress) >= 2 and progress[-1].startswith(f"100%  [{'#' * 24}]  {steps:,} steps "), progress


@pytest.mark.slow
@pytest.mark.extended   # 24 s; the local display is checked in the suite
def test_ray_mode_shows_the_same_display(tmp_path):
    # A private Ray, started by the run itself on loopback, with one actor.
    code, text = in_terminal([*CLI, *SHORT, "--mode", "ray", "--num-actors", "1", "--run-dir", "run"], 80, tmp_path)
    assert code == 0, text[-3000:]
    steps = json.loads((tmp_path / "run" / "summary.json").read_text())["env_steps"]
    redraws = [p for p in ESCAPE.sub("", text).split("\r") if PROGRESS.match(p)]  # Ray prints lines of its own
    assert len(redraws) >= 2, repr(text[-3000:])
    assert all(len(p.rstrip("\n")) <= 80 for p in redraws), redraws
    assert redraws[-1].startswith(f"100%  {steps:,}") and "took" in redraws[-1], redraws[-1]
