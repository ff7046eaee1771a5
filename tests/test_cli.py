"""The `rlvitals` command end to end: bad input is one line and exit 2; a real run archives what it should.

Every command runs as a real subprocess of the installed console script. The
subprocesses of one table are started together and awaited together, so the
module stays fast on a small machine.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from rlvitals.config import TrainConfig

DEFAULTS = TrainConfig()

RLVITALS = str(Path(sys.executable).with_name("rlvitals")) if Path(sys.executable).with_name("rlvitals").exists() \
    else shutil.which("rlvitals")
TIMEOUT = 180
NOT_DIVIDING = next(k for k in (3, 5, 7, 9, 11) if DEFAULTS.batch_size % k)


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLVITALS_")}
    env.update(extra)
    return env


def start(args: list[str], cwd: Path, env: dict[str, str] | None = None, prefix: list[str] = ()) -> subprocess.Popen:
    """The command in a subprocess; `prefix` runs it under another command (setpriv, to drop root's overrides)."""
    return subprocess.Popen([*prefix, RLVITALS, *map(str, args)], cwd=cwd, env=env or cli_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def finish(proc: subprocess.Popen) -> Result:
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return Result(proc.returncode, out, err)


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> Result:
    return finish(start(args, cwd, env))


# ------------------------------------------------------------------ bad input
@dataclass
class Case:
    id: str
    args: list
    names: list[str]
    """Substrings the error line must contain (the bad value, and what it was given for)."""
    run_dir: Path | None = None
    existing: dict = field(default_factory=dict)


def bad_input_cases(scratch: Path, bound_port: int) -> list[Case]:
    unknown_key = scratch / "unknown-key.yaml"
    unknown_key.write_text("seed: 3\nbogus_field: 1\n")
    not_mapping = scratch / "list.yaml"
    not_mapping.write_text("- seed\n- 3\n")
    full = scratch / "full-run-dir"
    full.mkdir()
    (full / "precious.txt").write_text("keep me")

    def train(case_id, args, names):
        return Case(case_id, ["train", *args, "--run-dir", scratch / f"run-{case_id}"], names,
                    run_dir=scratch / f"run-{case_id}")

    return [
        train("unknown-env", ["--env", "NoSuchEnv-v0"], ["env=", "NoSuchEnv-v0"]),
        train("zero-steps", ["--total-env-steps", "0"], ["total_env_steps=0"]),
        train("negative-envs", ["--num-envs", "-3"], ["num_envs=-3"]),
        train("bad-verbosity", ["--verbosity", "loud"], ["verbosity", "'loud'"]),
        train("missing-config", ["--config", "/nonexistent.yaml"], ["/nonexistent.yaml"]),
        train("unknown-config-key", ["--config", unknown_key], ["'bogus_field'"]),
        train("config-not-mapping", ["--config", not_mapping], [str(not_mapping), "mapping"]),
        train("gamma-above-one", ["--gamma", "1.5"], ["gamma=1.5"]),
        train("learning-rate-text", ["--learning-rate", "abc"], ["learning_rate='abc'"]),
        train("port-out-of-range", ["--metrics-port", "70000"], ["metrics_port=70000"]),
        train("port-in-use", ["--metrics-port", str(bound_port)], [f"metrics_port={bound_port}", "in use"]),
        train("minibatches-not-dividing", ["--num-minibatches", str(NOT_DIVIDING)],
              [f"num_minibatches={NOT_DIVIDING}", str(DEFAULTS.batch_size)]),
        Case("run-dir-not-empty", ["train", "--total-env-steps", "64", "--run-dir", full], [str(full), "not empty"],
             run_dir=full, existing={"precious.txt": "keep me"}),
        Case("eval-missing-run-dir", ["eval", "--run-dir", "/nonexistent"], ["run_dir='/nonexistent'"],
             run_dir=Path("/nonexistent")),
        Case("eval-zero-episodes", ["eval", "--run-dir", scratch / "no-run", "--episodes", "0"], ["--episodes=0"],
             run_dir=scratch / "no-run"),
    ]


CASE_IDS = [  # the ids of bad_input_cases(), in order (checked by the fixture)
    "unknown-env", "zero-steps", "negative-envs", "bad-verbosity", "missing-config", "unknown-config-key",
    "config-not-mapping", "gamma-above-one", "learning-rate-text", "port-out-of-range", "port-in-use",
    "minibatches-not-dividing", "run-dir-not-empty", "eval-missing-run-dir", "eval-zero-episodes"]


@pytest.fixture(scope="module")
def bad_input(launched):
    """{case id: (case, result, cwd)} of every bad-input case."""
    return launched.bad


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(bad_input, case_id):
    case, result, cwd = bad_input[case_id]
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and result.stderr.endswith("\n"), result.stderr
    line = lines[0]
    assert line.startswith("rlvitals: error: "), line
    for name in case.names:
        assert name in line, f"{name!r} missing from {line!r}"
    assert result.stdout == ""
    if case.existing:
        assert {p.name: p.read_text() for p in case.run_dir.iterdir()} == case.existing
    elif case.run_dir is not None:
        assert not case.run_dir.exists(), f"{case.run_dir} was created"
    assert list(cwd.iterdir()) == [], "nothing may be written to the working directory (no default runs/ dir)"


@pytest.mark.parametrize("args, names", [
    (["train", "--no-such-flag", "1"], ["--no-such-flag"]),
    (["runs", "{tmp}/no-runs-here"], ["{tmp}/no-runs-here"]),
    (["runs", "{tmp}", "--filter", "colour"], ["--filter", "'colour'"]),
    (["runs", "{tmp}", "--sort=-colour"], ["--sort", "'-colour'"]),
], ids=["unknown-flag", "runs-missing-directory", "runs-bad-filter", "runs-bad-sort"])
def test_more_bad_input_in_process(tmp_path, capsys, args, names):
    """The same contract through `rlvitals.cli.main` in this process (no interpreter start-up per case)."""
    from rlvitals.cli import main

    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "config.yaml").write_text("env: CartPole-v1\nseed: 0\n")
    capsys.readouterr()
    code = main([a.replace("{tmp}", str(tmp_path)) for a in args])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("rlvitals: error: "), err
    for name in names:
        assert name.replace("{tmp}", str(tmp_path)) in err


# ------------------------------------------------------------------ happy path
SECRET = f"rlvitals-test-secret-{uuid.uuid4().hex}"
RUN_A_ARGS = ["train", "--env", "CartPole-v1", "--mode", "local", "--total-env-steps", "4096", "--seed", "1",
              "--run-dir", "{A}", "--verbosity", "minimal", "--progress", "false"]
RUN_B_FILE = {"seed": 2, "learning_rate": 0.001, "total_env_steps": 2048, "num_envs": 8,
              "verbosity": "off", "progress": False, "update_epochs": 2}


@dataclass
class Runs:
    parent: Path
    a: Path
    b: Path
    args_a: list
    result_a: Result
    result_b: Result
    eval_a: Result | None
    """`rlvitals eval --run-dir A --episodes 3`, started as soon as A finished."""


@dataclass
class Launched:
    bad: dict
    runs: Runs | None


@pytest.fixture(scope="module")
def launched(tmp_path_factory, request) -> Launched:
    """Every subprocess of this module, started together so they share the machine's cores.

    Run A trains from flags with a secret in its environment; run B from a YAML
    file plus an overriding flag; the bad-input cases run beside them while a
    test socket holds the port of the port-in-use case. The training runs are
    started only when a selected test needs them (`-m "not slow"` skips them).
    """
    root = tmp_path_factory.mktemp("happy")
    parent = root / "runs"
    a, b = parent / "A", parent / "B"
    config = root / "b.yaml"
    config.write_text(yaml.safe_dump(RUN_B_FILE))
    args_a = [str(a) if x == "{A}" else x for x in RUN_A_ARGS]
    proc_a = proc_b = None
    if any("two_runs" in getattr(item, "fixturenames", ()) for item in request.session.items):
        proc_a = start(args_a, root, cli_env(RLVITALS_TEST_TOKEN=SECRET, MY_API_KEY=SECRET))
        proc_b = start(["train", "--config", config, "--learning-rate", "0.0005", "--run-dir", b], root)

    scratch = tmp_path_factory.mktemp("bad-input")
    cwd = scratch / "cwd"
    cwd.mkdir()
    with socket.socket() as holder:  # a port that is certainly in use while the cases run
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        cases = bad_input_cases(scratch, holder.getsockname()[1])
        assert [c.id for c in cases] == CASE_IDS
        procs = [(case, start(case.args, cwd)) for case in cases]
        result_a = finish(proc_a) if proc_a else None
        proc_eval = None
        if result_a is not None and result_a.returncode == 0:
            proc_eval = start(["eval", "--run-dir", a, "--episodes", "3"], parent)
        bad = {case.id: (case, finish(proc), cwd) for case, proc in procs}
    runs = None
    if proc_b is not None:
        runs = Runs(parent, a, b, args_a, result_a, finish(proc_b), finish(proc_eval) if proc_eval else None)
    return Launched(bad, runs)


@pytest.fixture(scope="module")
def two_runs(launched) -> Runs:
    assert launched.runs is not None
    return launched.runs


@pytest.mark.slow
def test_train_writes_a_complete_archive(two_runs):
    r, a = two_runs.result_a, two_runs.a
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    for name in ("config.yaml", "meta.json", "metrics.jsonl", "summary.json", "checkpoints/latest.pt"):
        assert (a / name).is_file(), name

    config = yaml.safe_load((a / "config.yaml").read_text())
    assert (config["env"], config["seed"], config["total_env_steps"], config["mode"]) == \
        ("CartPole-v1", 1, 4096, "local")
    assert config["run_dir"] == str(a)

    meta = json.loads((a / "meta.json").read_text())
    assert isinstance(meta["run_id"], str) and meta["run_id"]
    assert meta["command"] == ["rlvitals", *two_runs.args_a]
    assert set(meta["code_version"]) >= {"commit", "dirty"}
    assert {"torch", "gymnasium", "numpy"} <= set(meta["packages"])
    assert not any(k.lower() in ("env", "environ", "environment") for k in meta)

    summary = json.loads((a / "summary.json").read_text())
    assert summary["env_steps"] >= 4096 and summary["episodes"] > 0 and summary["learner_steps"] > 0
    assert json.loads(r.stdout.strip().splitlines()[-1]) == summary

    rows = [json.loads(line) for line in (a / "metrics.jsonl").read_text().splitlines()]
    assert rows and rows[-1]["env_steps"] == summary["env_steps"]
    assert [row["updates"] for row in rows] == sorted(row["updates"] for row in rows)


@pytest.mark.slow
def test_run_dir_holds_no_process_environment(two_runs):
    assert two_runs.result_a.returncode == 0, two_runs.result_a.stderr
    files = [p for p in two_runs.a.rglob("*") if p.is_file()]
    assert len(files) >= 5
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), f"{path} leaks the process environment"


@pytest.mark.slow
def test_config_file_with_flag_override(two_runs):
    r, b = two_runs.result_b, two_runs.b
    assert r.returncode == 0, r.stderr
    config = yaml.safe_load((b / "config.yaml").read_text())
    assert config["learning_rate"] == 0.0005, "a command-line flag must beat the config file"
    assert (config["seed"], config["num_envs"], config["total_env_steps"], config["update_epochs"]) == (2, 8, 2048, 2)
    assert config["rollout_length"] == DEFAULTS.rollout_length, "fields in neither file nor flags keep their defaults"
    summary = json.loads((b / "summary.json").read_text())
    assert summary["env_steps"] >= 2048
    # every update is update_epochs (2, from the file) x num_minibatches (default) optimizer steps
    assert summary["learner_steps"] == summary["updates"] * 2 * DEFAULTS.num_minibatches


@pytest.mark.slow
def test_eval_prints_one_json_object(two_runs):
    assert two_runs.result_a.returncode == 0, two_runs.result_a.stderr
    r = two_runs.eval_a
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1, r.stdout
    result = json.loads(lines[0])
    assert result["episodes"] == 3 and result["env"] == "CartPole-v1"
    assert result["greedy"] is True, "eval acts greedily by default"
    assert result["checkpoint"] == str(two_runs.a / "checkpoints" / "latest.pt")
    assert 1 <= result["min"] <= result["mean"] <= result["max"] <= 500
    assert result["std"] >= 0
    assert result["min"] < result["max"] or result["std"] == 0


def _runs(two_runs: Runs, *flags: str) -> str:
    """`rlvitals runs PARENT FLAGS...` as a subprocess; its stdout."""
    assert two_runs.result_a.returncode == 0 and two_runs.result_b.returncode == 0
    r = run(["runs", two_runs.parent, *flags], two_runs.parent)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return r.stdout


def _runs_in_process(two_runs: Runs, capsys, *flags: str) -> str:
    """The same command through `rlvitals.cli.main` in this process (no interpreter start-up per call)."""
    from rlvitals.cli import main

    assert two_runs.result_a.returncode == 0 and two_runs.result_b.returncode == 0
    capsys.readouterr()
    code = main(["runs", str(two_runs.parent), *flags])
    out, err = capsys.readouterr()
    assert code == 0 and err == "", err
    return out


@pytest.mark.slow
def test_runs_table_shows_both_runs_and_what_differs(two_runs):
    lines = _runs(two_runs, "--sort", "seed").strip().splitlines()
    assert len(lines) == 3, lines  # header + two runs
    header, first, second = lines
    assert header.split()[:4] == ["run", "env", "algorithm", "seed"]
    assert first.split()[:4] == ["A", "CartPole-v1", "ppo", "1"]
    assert second.split()[:4] == ["B", "CartPole-v1", "ppo", "2"]
    assert f"learning_rate={DEFAULTS.learning_rate}" in first and "learning_rate=0.0005" in second
    assert f"num_envs={DEFAULTS.num_envs}" in first and "num_envs=8" in second
    assert "seed=" not in first, "identity fields are columns, not differences"


@pytest.mark.slow
def test_runs_sort_filter_top_and_json(two_runs, capsys):
    table = json.loads(_runs_in_process(two_runs, capsys, "--json", "--sort=-seed"))
    assert [row["run"] for row in table] == ["B", "A"]
    assert {row["status"] for row in table} == {"completed"}
    assert all(isinstance(row["final_return"], float) for row in table)

    table = json.loads(_runs_in_process(two_runs, capsys, "--json", "--sort", "seed"))
    assert [row["run"] for row in table] == ["A", "B"]

    table = json.loads(_runs_in_process(two_runs, capsys, "--json", "--filter", "seed=2"))
    assert [row["run"] for row in table] == ["B"]
    assert "learning_rate=0.0005" in table[0]["differences"]

    table = json.loads(_runs_in_process(two_runs, capsys, "--json", "--sort", "seed", "--top", "1"))
    assert [row["run"] for row in table] == ["A"]

    lines = _runs_in_process(two_runs, capsys, "--sort=-seed", "--top", "1").strip().splitlines()
    assert len(lines) == 2 and lines[1].split()[0] == "B"
