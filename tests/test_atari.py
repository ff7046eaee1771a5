"""Atari (the `atari` extra): ALE vector envs, rollouts through the runner, training with both
image trunks, and the benchmark harness's machine-described JSON results.

Real ALE games throughout (ale-py ships its ROMs); the tests that need ale-py are skipped
only when it is not importable, and CI installs it with the `test` extra.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlvitals.actors.agents import RandomAgent
from rlvitals.actors.envs import AUTORESET_MODE, EnvError, make_vector_env
from rlvitals.actors.runner import EnvRunner
from rlvitals.archive import RunArchive
from rlvitals.config import ConfigError, TrainConfig
from rlvitals.learner.networks import ActorCritic, ImageIntake, ImpalaIntake

ROOT = Path(__file__).resolve().parent.parent
PONG = "ALE/Pong-v5"
RLVITALS = str(Path(sys.executable).with_name("rlvitals")) if Path(sys.executable).with_name("rlvitals").exists() \
    else shutil.which("rlvitals")
needs_ale = pytest.mark.skipif(importlib.util.find_spec("ale_py") is None,
                               reason="ale-py is not installed (pip install rlvitals[atari])")


@needs_ale
def test_native_vector_env_is_next_step_with_uint8_frame_stacks():
    from ale_py.vector_env import AtariVectorEnv

    env = make_vector_env(PONG, 4)
    try:
        assert isinstance(env, AtariVectorEnv)
        assert env.metadata["autoreset_mode"] == AUTORESET_MODE
        assert "autoreset_mode" not in gym.vector.VectorEnv.metadata, "ALE must not set every vector env's mode"
        assert env.single_observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        obs, _ = env.reset(seed=0)
        assert obs.shape == (4, 4, 84, 84) and obs.dtype == np.uint8
        assert (obs[:, :3] == 0).all() and obs[:, 3].any(), "a fresh stack is zero-padded behind the first frame"
        obs, reward, term, trunc, _ = env.step(np.zeros(4, dtype=np.int64))
        assert obs.shape == (4, 4, 84, 84) and obs.dtype == np.uint8
        assert reward.shape == term.shape == trunc.shape == (4,)
    finally:
        env.close()


@needs_ale
def test_gymnasium_wrapper_fallback_without_opencv_says_what_to_install(monkeypatch):
    from rlvitals.actors.atari import AtariOptions

    monkeypatch.setitem(sys.modules, "cv2", None)  # `import cv2` fails here whether opencv is installed or not
    with pytest.raises(EnvError, match=r"need opencv: pip install opencv-python-headless, or ale-py>=0\.11"):
        make_vector_env(PONG, 2, AtariOptions(native=False))


@needs_ale
@pytest.mark.skipif(importlib.util.find_spec("cv2") is None,
                    reason="opencv is not installed (pip install opencv-python-headless): gymnasium's "
                           "AtariPreprocessing resizes with it")
def test_gymnasium_wrapper_fallback_matches_the_native_layout():
    from rlvitals.actors.atari import AtariOptions

    env = make_vector_env(PONG, 2, AtariOptions(native=False))
    native = make_vector_env(PONG, 2)
    try:
        assert isinstance(env, gym.vector.SyncVectorEnv)
        assert env.metadata["autoreset_mode"] == AUTORESET_MODE
        assert env.single_observation_space == native.single_observation_space
        assert env.single_action_space == native.single_action_space
        obs, _ = env.reset(seed=1)
        assert obs.dtype == np.uint8 and (obs[:, :3] == 0).all()
        assert np.array_equal(obs, native.reset(seed=1)[0]), "both paths see the same first frame"
        for _ in range(20):
            obs, reward, *_ = env.step(np.array([2, 3]))
        assert obs.shape == (2, 4, 84, 84) and set(np.unique(reward)) <= {-1.0, 0.0, 1.0}
    finally:
        env.close()
        native.close()


def test_missing_ale_py_is_one_line_naming_the_extra(tmp_path):
    code = ("import sys; sys.modules['ale_py'] = None; from rlvitals.cli import main; "
            f"sys.exit(main(['train', '--env', '{PONG}', '--run-dir', 'run']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install rlvitals[atari]" in lines[0] and PONG in lines[0], proc.stderr
    assert not (tmp_path / "run").exists()


@needs_ale
def test_random_agent_rollouts_through_the_runner_are_sane():
    runner = EnvRunner(PONG, 4, seed=3)
    agent = RandomAgent(runner.action_space, 0)
    try:
        assert runner.obs_dtype == np.uint8
        rollouts = [runner.collect(agent, 100) for _ in range(3)]
    finally:
        runner.close()
    rewards = torch.cat([r.rewards for r in rollouts])
    assert set(rewards.unique().tolist()) <= {-1.0, 0.0, 1.0} and rewards.abs().sum() > 0, \
        "1,200 random Pong steps lose some points"
    for before, after in zip(rollouts, rollouts[1:], strict=False):
        assert torch.equal(before.obs[-1], after.obs[0]), "rollouts continue where the last one stopped"
    for r in rollouts:
        assert r.obs.dtype == torch.uint8 and r.obs.shape == (101, 4, 4, 84, 84)
        assert r.actions.shape == (100, 4) and int(r.actions.max()) < 6
        assert r.env_steps == int(r.valid.sum()) > 0
        # Frame stacking: inside an episode the stack shifts by one frame per step.
        same_episode = (r.valid & ~(r.terminated | r.truncated)).reshape(100, 4, 1, 1, 1)
        shifted = r.obs[1:, :, :3] == r.obs[:-1, :, 1:]
        assert (shifted | ~same_episode).all()
        assert (r.obs[1:, :, 3] != r.obs[:-1, :, 3]).any(), "the newest frame changes"


@needs_ale
@pytest.mark.parametrize("image_network, extra", [
    # The IMPALA trunk costs ~6x the Nature CNN per sample on a CPU: it trains one batch.
    ("nature", ["--total-env-steps", "512"]),
    pytest.param("impala", ["--total-env-steps", "256"], marks=pytest.mark.extended),
])
def test_train_on_pong_writes_a_checkpoint(tmp_path, image_network, extra):
    run_dir = tmp_path / image_network
    cmd = [RLVITALS, "train", "--env", PONG, "--num-envs", "4", "--rollout-length", "64", *extra,
           "--image-network", image_network, "--update-epochs", "1", "--num-minibatches", "2",
           "--run-dir", str(run_dir), "--progress", "false", "--verbosity", "off", "--device", "cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["env_steps"] >= int(extra[1])
    state = RunArchive(run_dir).load_checkpoint()
    assert state["config"]["image_network"] == image_network
    residual = any(".conv0." in name for name in state["network"])
    assert residual == (image_network == "impala")


def test_impala_intake_shapes_and_selection():
    for shape in ((4, 84, 84), (84, 84, 4), (3, 64, 64)):
        intake = ImpalaIntake(shape)
        out = intake(torch.randint(0, 256, (2, *shape), dtype=torch.uint8))
        assert out.shape == (2, 256) and intake.out_dim == 256 and (out >= 0).all()
    space, actions = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6)
    net = ActorCritic(space, actions, image_network="impala")
    assert isinstance(net.policy_intake, ImpalaIntake) and net.value_intake is net.policy_intake
    assert isinstance(ActorCritic(space, actions).policy_intake, ImageIntake)
    params, value = net(torch.zeros(3, 4, 84, 84, dtype=torch.uint8))
    assert params.shape == (3, 6) and value.shape == (3,)
    with pytest.raises(ValueError, match="image_network"):
        ActorCritic(space, actions, image_network="resnet50")
    with pytest.raises(ConfigError, match="image_network='resnet50' is invalid: expected one of nature, impala"):
        TrainConfig(image_network="resnet50").validate()


def test_harness_env_limit_writes_a_result_with_the_machine(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "harness.py"), "env-limit", "--env", "CartPole-v1",
                           "--repeats", "2", "--seconds", "0.3", "--num-envs", "4", "--results-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "env-limit_CartPole-v1.json").read_text())
    assert result["scenario"] == "env-limit" and result["config"]["num_envs"] == 4
    machine = result["machine"]
    assert {"cpu", "cpu_count", "gpu", "python", "packages", "code_version"} <= machine.keys()
    assert machine["cpu_count"] >= 1 and "torch" in machine["packages"] and "commit" in result["code_version"]
    rate = result["figures"]["env_steps_per_second"]
    assert rate["n"] == 2 and 0 < rate["min"] <= rate["median"] <= rate["max"]
