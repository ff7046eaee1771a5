"""`env_kwargs` reach every env a run makes: local mode, Ray actors, the spaces, the checks, eval.

The env is tests/kwargs_envs.py's KwargsEcho: with bonus=2.5 every episode returns exactly 25.0
(10.0 with the default), and with size=5 its observations have 5 elements (3 by default), so an env
built anywhere without the kwargs either returns the wrong amount or does not fit the network.
Real subprocesses of the real command; the Ray run joins a private Ray head (tests/test_ray.py's fixture).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
import test_ray
import torch
import yaml
from test_cli import cli_env, finish, start

from rlvitals.actors.agents import RandomAgent
from rlvitals.actors.envs import EnvError, make_vector_env
from rlvitals.actors.runner import EnvRunner
from rlvitals.cli import build_parser, train_config_from_args
from rlvitals.config import ConfigError, build_config

TESTS = Path(__file__).parent
ECHO = "kwargs_envs:KwargsEcho-v0"
KWARGS = {"bonus": 2.5, "size": 5}
RETURN = 25.0  # kwargs_envs.EPISODE_STEPS * bonus
SMALL = ["--num-envs", "4", "--rollout-length", "16", "--num-minibatches", "2", "--update-epochs", "1",
         "--total-env-steps", "192", "--verbosity", "off", "--no-progress", "--device", "cpu"]

ray_address = test_ray.ray_address  # a private Ray head for this module


def with_tests_on_path(**extra: str) -> dict[str, str]:
    return cli_env(PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                   **extra)


def episodes(env_id: str, env_kwargs: dict | None, steps: int, num_envs: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(returns, lengths) of the episodes a random agent finishes in `steps` steps."""
    runner = EnvRunner(env_id, num_envs, seed=0, env_kwargs=env_kwargs)
    try:
        rollout = runner.collect(RandomAgent(runner.action_space, 0), steps)
    finally:
        runner.close()
    return rollout.episodes.returns, rollout.episodes.lengths


# ------------------------------------------------------------------ the value
@pytest.mark.parametrize("text", ['{"bonus": 2.5, "size": 5}', "{bonus: 2.5, size: 5}", "bonus: 2.5\nsize: 5"],
                         ids=["json", "yaml-flow", "yaml-block"])
def test_the_flag_takes_json_or_yaml(text):
    assert build_config(None, {"env_kwargs": text}).env_kwargs == KWARGS


def test_json_numbers_stay_numbers_and_empty_means_none():
    assert build_config(None, {"env_kwargs": '{"g": 1e-3}'}).env_kwargs == {"g": 0.001}
    assert build_config(None, {"env_kwargs": ""}).env_kwargs == {}
    assert build_config(None, {}).env_kwargs == {}


def test_a_config_file_value_that_is_not_a_mapping_is_one_line_exit_2(tmp_path, capsys):
    from rlvitals.cli import main

    config = tmp_path / "run.yaml"
    config.write_text("env_kwargs: [g, 9.81]\n")
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "env_kwargs=['g', 9.81] is invalid" in err and "mapping" in err, err
    assert not (tmp_path / "run").exists()


def test_the_flag_replaces_the_config_file_mapping(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("env_kwargs:\n  bonus: 2.5\n  size: 5\n")
    parser = build_parser()
    assert train_config_from_args(parser.parse_args(["train", "--config", str(config)])).env_kwargs == KWARGS
    given = parser.parse_args(["train", "--config", str(config), "--env-kwargs", '{"bonus": 1}'])
    assert train_config_from_args(given).env_kwargs == {"bonus": 1}


@pytest.mark.parametrize("value, names", [
    ("[1, 2]", ["env_kwargs='[1, 2]'", "mapping"]),
    ('{"g": 1', ["not valid JSON or YAML"]),
    ("{1: 2}", ["1 is not an argument name"]),
    ({"g": {1, 2}}, ["value of 'g' is a set"]),
    ("&a {x: 1}", ["not valid JSON or YAML"]),  # no YAML anchors, as in config files
])
def test_what_is_not_a_mapping_of_names_to_plain_values_is_refused(value, names):
    with pytest.raises(ConfigError) as caught:
        build_config(None, {"env_kwargs": value})
    for name in names:
        assert name in str(caught.value)


# ------------------------------------------------------------------ the env
def test_the_kwargs_reach_the_env_constructor():
    given, default = episodes(ECHO, KWARGS, 30)[0], episodes(ECHO, None, 30)[0]
    assert len(given) >= 2 and set(given.tolist()) == {RETURN}, given
    assert len(default) >= 2 and set(default.tolist()) == {10.0}, default
    env = make_vector_env("Pendulum-v1", 2, env_kwargs={"g": 3.5})
    try:
        assert [e.unwrapped.g for e in env.envs] == [3.5, 3.5]
    finally:
        env.close()


def test_vector_entry_point_and_time_limit_take_them_too():
    returns, _ = episodes("CartPole-v1", {"sutton_barto_reward": True}, 200)  # CartPole's own vector env
    assert len(returns) > 0 and set(returns.tolist()) == {-1.0}, returns  # 0 a step, -1 when the pole falls
    _, lengths = episodes("Pendulum-v1", {"max_episode_steps": 7}, 30)  # gymnasium's make: a TimeLimit
    assert len(lengths) >= 2 and set(lengths.tolist()) == {7}, lengths


@pytest.mark.parametrize("env_id, env_kwargs, names", [
    ("Pendulum-v1", {"gravity": 9.81}, ["'gravity'", "accepted: g, max_episode_steps, render_mode"]),
    ("CartPole-v1", {"bogus": 1}, ["'bogus'", "max_episode_steps, render_mode, sutton_barto_reward"]),
    ("CartPole-v1", {"num_envs": 8}, ["num_envs is set by --num-envs"]),
    (ECHO, {"gravity": 1}, ["'gravity'", "accepted: bonus, max_episode_steps, render_mode, size"]),
])
def test_a_name_the_constructor_does_not_take_is_refused_with_those_it_takes(env_id, env_kwargs, names):
    with pytest.raises(EnvError) as caught:
        make_vector_env(env_id, 2, env_kwargs=env_kwargs)
    for name in names:
        assert name in str(caught.value), str(caught.value)


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="ale-py is not installed")
def test_atari_takes_the_id_settings_and_refuses_the_fixed_preprocessing():
    _, lengths = episodes("ALE/Pong-v5", {"max_num_frames_per_episode": 100}, 40)
    assert len(lengths) >= 2 and lengths.max() <= 25, lengths  # 100 frames at frame skip 4
    with pytest.raises(EnvError, match="'frameskip' is fixed by the standard Atari preprocessing"):
        make_vector_env("ALE/Pong-v5", 1, env_kwargs={"frameskip": 2})


# ------------------------------------------------------------------ whole runs
def _input_width(run_dir: Path) -> int:
    network = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)["network"]
    first = next(t for name, t in network.items() if name.endswith("weight") and t.dim() == 2)
    return first.shape[1]


@pytest.mark.slow
def test_a_local_run_and_its_eval_use_the_kwargs(tmp_path):
    run_dir = tmp_path / "run"
    result = finish(start(["train", "--env", ECHO, "--env-kwargs", json.dumps(KWARGS), "--run-dir", run_dir,
                           *SMALL], tmp_path, with_tests_on_path()))
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["env_kwargs"] == KWARGS
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["episodes"] > 0 and summary["mean_return_last_100"] == RETURN
    assert _input_width(run_dir) == KWARGS["size"]
    # The env's module runs only because the command names it (a checkpoint never chooses code to run).
    evaluated = finish(start(["eval", "--run-dir", run_dir, "--episodes", "3", "--env", "kwargs_envs:KwargsEcho-v0"],
                             tmp_path, with_tests_on_path()))
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["mean"] == RETURN


@pytest.mark.slow
@pytest.mark.extended   # 15 s; local mode's kwargs are checked in the suite
def test_ray_actors_and_the_learner_use_the_kwargs(ray_address, tmp_path):
    run_dir = tmp_path / "run"
    proc = test_ray.train(test_ray.ray_args(ray_address, run_dir, "--env", ECHO, "--env-kwargs", json.dumps(KWARGS),
                                            "--num-actors", "1", *SMALL),
                          env={"PYTHONPATH": with_tests_on_path()["PYTHONPATH"]})
    summary, _ = test_ray.finish(proc)
    assert summary["mode"] == "ray" and summary["episodes"] > 0
    assert summary["mean_return_last_100"] == RETURN  # the actor's envs
    assert _input_width(run_dir) == KWARGS["size"]  # the learner's network, from the spaces of a throwaway env
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["env_kwargs"] == KWARGS


# ------------------------------------------------------------------ the doctor's env check
def _doctor_env(tmp_path: Path, *extra: str):
    return finish(start(["doctor", "--env", ECHO, "--json", *extra], tmp_path, with_tests_on_path()))


def test_the_doctor_checks_the_env_as_the_kwargs_make_it(tmp_path):
    healthy = _doctor_env(tmp_path)
    assert healthy.returncode == 0 and json.loads(healthy.stdout) == [], healthy.stderr
    # bonus NaN: every reward and observation is NaN, which only the kwargs can have caused
    broken = _doctor_env(tmp_path, "--env-kwargs", "{bonus: .nan}")
    assert broken.returncode == 1, broken.stderr
    rules = {v["rule"] for v in json.loads(broken.stdout)}
    assert {"doctor-env-reward-not-finite", "doctor-env-observation-not-finite"} <= rules, rules


def test_a_config_that_trains_the_same_env_lends_its_kwargs_unless_the_flag_is_given(tmp_path, monkeypatch):
    from rlvitals.doctor.command import request_from_args

    monkeypatch.syspath_prepend(str(TESTS))
    (tmp_path / "my.yaml").write_text(f"env: {ECHO}\nenv_kwargs: {{bonus: 7}}\n")
    parse = build_parser().parse_args
    assert request_from_args(parse(["doctor", "--env", ECHO, "--config", str(tmp_path / "my.yaml")])).env_kwargs \
        == {"bonus": 7}
    assert request_from_args(parse(["doctor", "--env", ECHO, "--config", str(tmp_path / "my.yaml"),
                                    "--env-kwargs", "{size: 4}"])).env_kwargs == {"size": 4}
    assert request_from_args(parse(["doctor", "--env", "CartPole-v1", "--config",
                                    str(tmp_path / "my.yaml")])).env_kwargs == {}


@pytest.mark.parametrize("extra,names", [
    (["--env", ECHO, "--env-kwargs", "{nope: 1}"], ["'nope'", "accepted: bonus, max_episode_steps, render_mode, size"]),
    (["--env-kwargs", "{bonus: 1}"], ["--env-kwargs=", "without --env"]),
    (["--env", ECHO, "--env-kwargs", "[1, 2]"], ["env_kwargs='[1, 2]' is invalid", "mapping"]),
])
def test_the_doctors_bad_kwargs_are_one_line_exit_2(tmp_path, extra, names):
    result = finish(start(["doctor", *extra], tmp_path, with_tests_on_path()))
    assert result.returncode == 2 and result.stdout == "", (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and all(name in lines[0] for name in names), result.stderr
    assert list(tmp_path.iterdir()) == []
