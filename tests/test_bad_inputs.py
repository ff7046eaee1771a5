"""Every bad input is one line on stderr naming the bad value and what is accepted, exit 2, no traceback,
and nothing left behind: no run directory, no file in the working directory, a run that was given
unchanged (issue 14 item 7).

Each case is a real subprocess of the installed command, with real files: broken env modules
(tests/bad_envs.py), corrupted copies of two short trained runs, hostile YAML. They run three at
a time; each fails in its checks, before any training starts.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from fault_conditions import ReadOnlyMount, Unreadable
from test_cli import Result, cli_env, finish, start
from test_resume_validation import SHAPED_ENV, snapshot

TESTS = Path(__file__).parent
SMALL = ["--num-envs", "4", "--rollout-length", "32", "--update-epochs", "1", "--num-minibatches", "2",
         "--verbosity", "off", "--progress", "false", "--total-env-steps", "256"]
SHORT_TRAIN = ["train", "--num-envs", "4", "--rollout-length", "16", "--num-minibatches", "2",
               "--total-env-steps", "64", "--progress", "false"]
TOO_BIG = 2**70
CONCURRENT = 3


class Payload:
    """A pickle that would run a command when loaded without weights_only."""

    def __reduce__(self):
        return (os.system, ("echo pwned",))


def edit_checkpoint(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        path = run / "checkpoints" / "latest.pt"
        state = torch.load(path, weights_only=True)
        change(state)
        torch.save(state, path)
    return apply


def write_checkpoint_bytes(data: bytes) -> Callable[[Path], None]:
    return lambda run: (run / "checkpoints" / "latest.pt").write_bytes(data)


@dataclass
class Case:
    id: str
    args: list
    names: list[str]
    """Substrings the error line must contain: the bad value, and what is accepted."""
    env: dict = field(default_factory=dict)
    run: str | None = None
    """A trained run ("cartpole" or "shaped") copied to {copy} for this case, changed by `corrupt` first."""
    corrupt: Callable[[Path], None] | None = None
    max_seconds: float | None = None
    condition: Unreadable | ReadOnlyMount | None = None
    """A real condition the copy is put in while the command runs (tests/fault_conditions.py)."""


def train(case_id: str, args: list, names: list[str], **kwargs) -> Case:
    return Case(case_id, [*SHORT_TRAIN, *args], names, **kwargs)


CASES = [
    # seeds and sizes no machine can hold
    train("seed-2**70", ["--seed", TOO_BIG], [f"seed={TOO_BIG}", "4294967295"]),
    train("seed-1e30-yaml", ["--config", "{scratch}/seed-1e30.yaml"], ["seed=1e+30", "integer"]),
    train("seed-1.0e+30-yaml", ["--config", "{scratch}/seed-float.yaml"], ["seed=1e+30", "integer"]),
    train("seed-negative", ["--seed", "-1"], ["seed=-1", "0 to 4294967295"]),
    train("total-steps-2**70", ["--total-env-steps", TOO_BIG], [f"total_env_steps={TOO_BIG}", "2**62"]),
    train("hidden-sizes-huge", ["--hidden-sizes", "100000,100000"],
          ["hidden_sizes=[100000, 100000]", "parameters", "of memory"]),
    train("rollout-length-huge", ["--rollout-length", "1000000000000", "--num-minibatches", "1"],
          ["rollout_length=1000000000000", "of memory"]),
    train("torch-threads-huge", ["--torch-threads", "100000"], ["torch_threads=100000", "at most 256"]),
    train("num-envs-huge", ["--num-envs", "1000000000", "--num-minibatches", "1"],
          ["num_envs=1000000000", "at most 65536"]),
    train("learning-rate-nan", ["--learning-rate", "nan"], ["learning_rate=nan", "finite"]),
    train("gamma-inf", ["--gamma", "inf"], ["gamma=inf", "[0, 1]"]),
    train("empty-env", ["--env", ""], ["env=''"]),
    train("metrics-port-negative", ["--metrics-port", "-1"], ["metrics_port=-1", "65535"]),
    train("keep-checkpoints-negative", ["--keep-checkpoints", "-1"], ["keep_checkpoints=-1", ">= 0"]),
    # where the run would live and talk
    train("metrics-host-unresolvable", ["--metrics-host", "bogus.invalid"], ["metrics_host='bogus.invalid'",
                                                                            "does not resolve"]),
    train("metrics-host-empty", ["--metrics-host", ""], ["metrics_host=''", "0.0.0.0"]),
    train("startup-timeout-1e300", ["--startup-timeout-seconds", "1e300"], ["startup_timeout_seconds=1e+300",
                                                                            "30 days"]),
    train("metrics-host-foreign-port-0", ["--metrics-host", "192.0.2.1", "--metrics-port", "0"],
          ["metrics_host='192.0.2.1'", "127.0.0.1"]),
    Case("run-dir-is-a-file", [*SHORT_TRAIN, "--run-dir", "{scratch}/a-file"], ["a-file'", "is a file"]),
    Case("run-dir-under-a-file", [*SHORT_TRAIN, "--run-dir", "{scratch}/a-file/run"],
         ["a-file/run'", "not a directory"]),
    Case("run-dir-where-nothing-can-be-made", [*SHORT_TRAIN, "--run-dir", "/proc/rlvitals-run"],
         ["run_dir='/proc/rlvitals-run'", "writable"]),
    train("ray-address-unresolvable", ["--mode", "ray", "--address", "bogus.invalid:6379"],
          ["address='bogus.invalid:6379'", "host:port"]),
    train("ray-actors-beyond-this-machine", ["--mode", "ray", "--num-actors", "100000000"],
          ["num_actors=100000000", "a private Ray on this machine"]),  # said before Ray starts
    # config files
    train("config-binary", ["--config", "{scratch}/binary.yaml"], ["binary.yaml'", "UTF-8"]),
    train("config-alias-bomb", ["--config", "{scratch}/bomb.yaml"], ["bomb.yaml'", "alias"], max_seconds=60),
    train("config-is-a-directory", ["--config", "{scratch}"], ["is unreadable"]),
    train("config-duplicate-key", ["--config", "{scratch}/duplicate.yaml"],
          ["duplicate.yaml'", "'seed' appears twice"]),
    train("config-nested-3000-deep", ["--config", "{scratch}/deep.yaml"], ["deep.yaml'", "more than 32 levels"]),
    train("config-dev-zero", ["--config", "/dev/zero"], ["'/dev/zero'", "not a regular file"], max_seconds=60),
    train("config-fifo", ["--config", "{scratch}/fifo"], ["fifo'", "a FIFO"], max_seconds=60),
    train("config-2-mb", ["--config", "{scratch}/big.yaml"], ["big.yaml'", "at most 1.0 MB"], max_seconds=60),
    # envs that cannot be used
    train("env-module-raises-on-import", ["--env", "bad_envs:ResetRaises-v0"],
          ["'bad_envs'", "RuntimeError", "refuses to be imported"], env={"BAD_ENVS_ON_IMPORT": "raise"}),
    train("env-module-exits-on-import", ["--env", "bad_envs:ResetRaises-v0"], ["'bad_envs'", "sys.exit(3)"],
          env={"BAD_ENVS_ON_IMPORT": "exit"}),
    train("env-reset-raises", ["--env", "bad_envs:ResetRaises-v0"], ["ResetRaises-v0", "reset()",
                                                                    "the simulator is not running"]),
    train("env-reset-wrong-type", ["--env", "bad_envs:ResetWrongType-v0"], ["ResetWrongType-v0", "reset()",
                                                                           "(obs, info)"]),
    train("env-first-step-raises", ["--env", "bad_envs:StepRaises-v0"], ["StepRaises-v0", "first step",
                                                                        "the simulator crashed"]),
    train("images-too-small-for-nature", ["--env", "bad_envs:SmallImages-v0"],
          ["image_network='nature'", "12x12", "36x36", "impala"]),
    train("fixed-action-out-of-range", ["--agent", "fixed", "--fixed-action", "99"], ["fixed_action=99", "0 to 1"]),
    train("fixed-agent-continuous-env", ["--agent", "fixed", "--env", "Pendulum-v1"], ["agent='fixed'", "Discrete"]),
    # env_kwargs: not a mapping, unparsable, a name the constructor does not take, a value it refuses
    train("env-kwargs-not-a-mapping", ["--env-kwargs", "[1, 2]"], ["env_kwargs='[1, 2]'", "mapping"]),
    train("env-kwargs-unparsable", ["--env-kwargs", '{"g": 1'], ["env_kwargs='{\"g\": 1'", "JSON or YAML"]),
    train("env-kwargs-name-refused", ["--env", "Pendulum-v1", "--env-kwargs", '{"gravity": 9.81}'],
          ["env_kwargs={'gravity': 9.81}", "'gravity'", "accepted: g, max_episode_steps, render_mode"]),
    train("env-kwargs-nested-3000-deep", ["--env-kwargs", "{\"a\": " + "[" * 3000 + "]" * 3000 + "}"],
          ["env_kwargs=", "more than 32 levels"]),
    train("env-kwargs-max-episode-steps-negative", ["--env-kwargs", '{"max_episode_steps": -1}'],
          ["max_episode_steps=-1", ">= 1"]),
    train("env-kwargs-max-episode-steps-fraction", ["--env-kwargs", "max_episode_steps: 1.5"],
          ["max_episode_steps=1.5", ">= 1"]),
    train("env-kwargs-max-episode-steps-inf", ["--env-kwargs", "max_episode_steps: .inf"],
          ["max_episode_steps=inf", ">= 1"]),
    train("env-kwargs-value-refused", ["--env", "kwargs_envs:KwargsEcho-v0", "--env-kwargs", '{"size": -1}'],
          ["env_kwargs={'size': -1}", "building it raised ValueError"]),
    # resume and eval of runs that no longer fit, or checkpoints that are not what they claim
    Case("resume-env-kwargs-changed", ["train", "--resume", "{copy}", "--total-env-steps", "5000", "--env-kwargs",
                                       '{"sutton_barto_reward": true}'],
         ["env_kwargs cannot change when resuming", "env_kwargs={}"], run="cartpole"),
    Case("eval-env-kwargs-the-env-no-longer-takes", ["eval", "--run-dir", "{copy}", "--episodes", "1"],
         ["env_kwargs={'bogus': 1}", "accepted: max_episode_steps"], run="cartpole",
         corrupt=edit_checkpoint(lambda s: s["config"].update(env_kwargs={"bogus": 1}))),
    Case("resume-observation-shape-changed", ["train", "--resume", "{copy}", "--total-env-steps", "5000"],
         ["does not fit env 'shaped:Shaped-v0'", "(7,)"], env={"SHAPED_PAD": "3"}, run="shaped"),
    Case("eval-observation-shape-changed", ["eval", "--run-dir", "{copy}", "--episodes", "1", "--env",
                                            "shaped:Shaped-v0"],
         ["does not fit env 'shaped:Shaped-v0'", "(7,)"], env={"SHAPED_PAD": "3"}, run="shaped"),
    Case("resume-checkpoint-tracker-empty", ["train", "--resume", "{copy}", "--total-env-steps", "5000"],
         ["latest.pt'", "incomplete", "env_steps"], run="cartpole",
         corrupt=edit_checkpoint(lambda s: s.update(tracker={}))),
    Case("resume-checkpoint-rng-not-a-dict", ["train", "--resume", "{copy}", "--total-env-steps", "5000"],
         ["latest.pt'", "its rng is a int"], run="cartpole", corrupt=edit_checkpoint(lambda s: s.update(rng=5))),
    Case("eval-checkpoint-network-empty", ["eval", "--run-dir", "{copy}", "--episodes", "1"],
         ["latest.pt'", "absent in the checkpoint"], run="cartpole",
         corrupt=edit_checkpoint(lambda s: s.update(network={}))),
    Case("eval-checkpoint-network-not-tensors", ["eval", "--run-dir", "{copy}", "--episodes", "1"],
         ["latest.pt'", "is not a tensor"], run="cartpole",
         corrupt=edit_checkpoint(lambda s: s.update(network={k: "x" for k in s["network"]}))),
    Case("eval-config-unknown-key", ["eval", "--run-dir", "{copy}", "--episodes", "1"],
         ["latest.pt'", "unknown config field 'bogus'"], run="cartpole",
         corrupt=edit_checkpoint(lambda s: s["config"].update(bogus=1))),
    Case("eval-checkpoint-malicious", ["eval", "--run-dir", "{copy}", "--episodes", "1"],
         ["latest.pt'", "not an rlvitals checkpoint"], run="cartpole",
         corrupt=write_checkpoint_bytes(pickle.dumps(Payload()))),
    Case("eval-checkpoint-torn", ["eval", "--run-dir", "{copy}", "--episodes", "1"],
         ["latest.pt'", "not an rlvitals checkpoint"], run="cartpole",
         corrupt=lambda run: (run / "checkpoints" / "latest.pt").write_bytes(
             (run / "checkpoints" / "latest.pt").read_bytes()[:500])),
    Case("eval-episodes-huge", ["eval", "--run-dir", "{copy}", "--episodes", "100000000000"],
         ["--episodes=100000000000", "1000000"], run="cartpole"),
    Case("eval-seed-negative", ["eval", "--run-dir", "{copy}", "--episodes", "1", "--seed", "-1"],
         ["--seed=-1", "4294967295"], run="cartpole"),
    # eval --checkpoint: a file that is not there, not a checkpoint, or not for the env as it is now
    Case("eval-checkpoint-missing", ["eval", "--checkpoint", "{scratch}/no-such.pt"],
         ["no-such.pt'", "does not exist", "latest, best or update-<N>"]),
    Case("eval-checkpoint-name-without-run-dir", ["eval", "--checkpoint", "best"], ["checkpoint='best'", "--run-dir"]),
    Case("eval-checkpoint-name-not-in-run", ["eval", "--run-dir", "{copy}", "--checkpoint", "update-999999"],
         ["checkpoint='update-999999'", "(there: latest, best, update-"], run="cartpole"),
    Case("eval-checkpoint-is-a-directory", ["eval", "--checkpoint", "{scratch}/empty-dir"],
         ["empty-dir'", "is a directory"]),
    Case("eval-checkpoint-a-yaml-file", ["eval", "--checkpoint", "{scratch}/seed-1e30.yaml"],
         ["seed-1e30.yaml'", "not an rlvitals checkpoint"]),
    Case("eval-checkpoint-foreign-torch-file", ["eval", "--checkpoint", "{scratch}/foreign.pt"],
         ["foreign.pt'", "not an rlvitals checkpoint"]),
    Case("eval-checkpoint-path-observation-shape-changed", ["eval", "--checkpoint", "{copy}/checkpoints/best.pt",
                                                            "--env", "shaped:Shaped-v0"],
         ["best.pt'", "does not fit env 'shaped:Shaped-v0'", "(7,)"], env={"SHAPED_PAD": "3"}, run="shaped"),
    Case("eval-checkpoints-folder-unreadable", ["eval", "--run-dir", "{copy}", "--episodes", "1"],
         ["checkpoints'", "not readable by this user", "Permission denied", "mode 000"], run="cartpole",
         condition=Unreadable("checkpoints")),
    Case("resume-run-dir-read-only", ["train", "--resume", "{copy}", "--total-env-steps", "5000"],
         ["cartpole'", "not writable", "Read-only file system"], run="cartpole", condition=ReadOnlyMount()),
    Case("eval-sample-and-greedy", ["eval", "--run-dir", "{copy}", "--sample", "--greedy"], ["--greedy", "--sample"],
         run="cartpole"),
    # the other commands
    Case("stack-prometheus-port-negative", ["stack", "up", "--prometheus-port", "-1", "--state-dir", "state"],
         ["--prometheus-port=-1", "1 to 65535"]),
    Case("stack-prometheus-port-70000", ["stack", "up", "--prometheus-port", "70000", "--state-dir", "state"],
         ["--prometheus-port=70000", "1 to 65535"]),
    Case("stack-scrape-interval-zero", ["stack", "up", "--scrape-interval", "0s", "--state-dir", "state"],
         ["--scrape-interval='0s'", "duration"]),
    Case("report-of-a-non-run", ["report", "{scratch}/empty-dir"], ["empty-dir'", "expected a run directory"]),
    Case("report-run-files-are-directories", ["report", "{scratch}/folders-run"],
         ["folders-run'", "config.yaml is a directory", "metrics.jsonl is a directory"]),
    Case("report-output-unwritable", ["report", "{copy}", "-o", "/proc/report.html"], ["'/proc/report.html'"],
         run="cartpole"),
    Case("dashboards-url-unclosed-bracket", ["dashboards", "push", "--url", "http://[::1"], ["--url='http://[::1'"]),
    Case("dashboards-timeout-nan", ["dashboards", "push", "--url", "http://127.0.0.1:1", "--timeout", "nan"],
         ["--timeout=nan", "> 0"]),
    Case("doctor-seed-2**70", ["doctor", "--seed", TOO_BIG], [f"--seed={TOO_BIG}", "4294967295"]),
    Case("doctor-keep-a-regular-file", ["doctor", "--keep", "{scratch}/a-file"], ["--keep=", "a-file'", "is a file"]),
    Case("doctor-step-timeout-zero", ["doctor", "--env", "CartPole-v1", "--step-timeout", "0"],
         ["--step-timeout=0", "> 0"]),
    Case("doctor-env-module-raises", ["doctor", "--env", "bad_envs:ResetRaises-v0"], ["'bad_envs'", "RuntimeError"],
         env={"BAD_ENVS_ON_IMPORT": "raise"}),
]


def alias_bomb() -> str:
    """Ten lines, 9**9 strings when expanded ("billion laughs"), under a field the config knows."""
    levels = ["&a0 [" + ", ".join(["lol"] * 9) + "]"]
    levels += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    return "env: [\n" + ",\n".join(f"  {level}" for level in levels) + "]\n"


def make_scratch(root: Path) -> None:
    (root / "seed-1e30.yaml").write_text("seed: 1e30\n")
    (root / "seed-float.yaml").write_text("seed: 1.0e+30\n")
    (root / "binary.yaml").write_bytes(bytes(range(128, 256)) + b"\x00seed: 1\n")
    (root / "bomb.yaml").write_text(alias_bomb())
    (root / "duplicate.yaml").write_text("seed: 1\nseed: 2\n")
    (root / "deep.yaml").write_text("env_kwargs: {a: " + "[" * 3000 + "]" * 3000 + "}\n")
    (root / "big.yaml").write_text("seed: 1\n" + "# padding\n" * 200_000)
    os.mkfifo(root / "fifo")
    (root / "a-file").write_text("not a directory\n")
    (root / "empty-dir").mkdir()
    for name in ("config.yaml", "meta.json", "metrics.jsonl"):  # a run's files, each a folder
        (root / "folders-run" / name).mkdir(parents=True)
    (root / "shaped.py").write_text(SHAPED_ENV)
    torch.save({"weights": torch.zeros(3)}, root / "foreign.pt")  # a torch file, not a checkpoint


@dataclass
class Outcome:
    case: Case
    result: Result
    cwd: Path
    copy: Path | None
    before: dict
    seconds: float
    skipped: str | None = None
    """Why the case's condition cannot be made on this machine."""


def run_case(case: Case, scratch: Path, trained: dict[str, Path]) -> Outcome:
    if case.condition is not None and (reason := case.condition.unavailable()):
        return Outcome(case, Result(0, "", ""), scratch, None, {}, 0.0, skipped=reason)
    home = scratch / "cases" / case.id
    cwd = home / "cwd"
    cwd.mkdir(parents=True)
    copy, before = None, {}
    if case.run:
        copy = Path(shutil.copytree(trained[case.run], home / case.run))
        if case.corrupt:
            case.corrupt(copy)
        before = snapshot(copy)
    args = [str(a).replace("{scratch}", str(scratch)).replace("{copy}", str(copy)) for a in case.args]
    if args[0] == "train" and "--run-dir" not in args and "--resume" not in args:
        args += ["--run-dir", str(cwd / "run")]
    began = time.monotonic()
    prefix = case.condition.apply(copy) if case.condition is not None else []
    try:
        result = finish(start(args, cwd, cli_env(PYTHONPATH=f"{TESTS}{os.pathsep}{scratch}", **case.env), prefix))
    finally:
        if case.condition is not None:
            case.condition.undo(copy)
    return Outcome(case, result, cwd, copy, before, time.monotonic() - began)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Outcome]:
    scratch = tmp_path_factory.mktemp("bad-inputs")
    make_scratch(scratch)
    env = cli_env(PYTHONPATH=str(scratch))
    trained = {"cartpole": scratch / "trained-cartpole", "shaped": scratch / "trained-shaped"}
    runs = [start(["train", "--env", env_id, "--run-dir", trained[name], *SMALL], scratch, env)
            for name, env_id in (("cartpole", "CartPole-v1"), ("shaped", "shaped:Shaped-v0"))]
    for proc in runs:
        done = finish(proc)
        assert done.returncode == 0, done.stderr
    with ThreadPoolExecutor(CONCURRENT) as pool:
        return {o.case.id: o for o in pool.map(lambda case: run_case(case, scratch, trained), CASES)}


@pytest.mark.timeout(900)  # the first case sets up the whole table: 70 subprocesses, 3 at a time (7 min at load 12)
@pytest.mark.parametrize("case_id", [case.id for case in CASES])
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(outcomes, case_id):
    outcome = outcomes[case_id]
    if outcome.skipped:
        pytest.skip(outcome.skipped)
    result = outcome.result
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlvitals: error: "), result.stderr
    for name in outcome.case.names:
        assert name in lines[0], f"{name!r} missing from {lines[0]!r}"
    assert "weights_only" not in lines[0], "never advise loading a checkpoint with weights_only=False"
    assert result.stdout == ""
    assert list(outcome.cwd.iterdir()) == [], "nothing may be written: no run directory, no state folder"
    if outcome.copy is not None:
        assert snapshot(outcome.copy) == outcome.before, "the run given must stay as it was"
    if outcome.case.max_seconds is not None:
        assert outcome.seconds < outcome.case.max_seconds, f"took {outcome.seconds:.1f} s"


def test_an_alias_bomb_is_refused_within_a_second(tmp_path):
    from rlvitals.config import ConfigError, load_yaml

    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    began = time.monotonic()
    with pytest.raises(ConfigError, match="alias"):
        load_yaml(path)
    assert time.monotonic() - began < 1.0


@pytest.mark.parametrize("summary", ['{"env_steps": 1', "[1, 2]", "\xff\xfe"], ids=["torn", "list", "binary"])
def test_runs_names_and_skips_a_run_whose_summary_is_unreadable(tmp_path, summary):
    for name, text in (("good-run", '{"env_steps": 5, "mean_return_last_100": 9.5}'), ("bad-run", summary)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text("env: CartPole-v1\nseed: 0\n")
        (tmp_path / name / "summary.json").write_bytes(text.encode("latin-1"))
    result = finish(start(["runs", tmp_path], tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and str(tmp_path / "bad-run") in lines[0] and "summary.json" in lines[0], result.stderr
    assert "good-run" in result.stdout and "bad-run" not in result.stdout


TORCH_LEFT_UNLOADED = """
import sys
from rlvitals.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(code, "torch" in sys.modules)
"""


@pytest.mark.parametrize("args", [
    ["train", "--env", "bad_envs:ResetRaises-v0", "--run-dir", "{tmp}/run"],
    ["train", "--run-dir", "{tmp}/a-file"],
    ["eval", "--checkpoint", "{tmp}/no-such.pt"],
    ["eval", "--run-dir", "{tmp}", "--checkpoint", "best"],
], ids=["env-reset-raises", "run-dir-is-a-file", "checkpoint-missing", "run-dir-without-config"])
def test_inputs_that_need_no_network_are_refused_before_torch_is_imported(tmp_path, args):
    """Seconds on a small machine (torch and its compiler stack take ~3.5 s to import here)."""
    (tmp_path / "a-file").write_text("not a directory\n")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = subprocess.run([sys.executable, "-c", TORCH_LEFT_UNLOADED, *argv], capture_output=True, text=True,
                            env=cli_env(PYTHONPATH=str(TESTS)), cwd=tmp_path, timeout=120)
    assert result.stdout.split() == ["2", "False"], (result.stdout, result.stderr)
    assert result.stderr.startswith("rlvitals: error: ") and len(result.stderr.splitlines()) == 1, result.stderr
