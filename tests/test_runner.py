"""The env runner: NEXT_STEP autoreset, reward/observation pairing, episode stats, env errors, probe agents.

Real gymnasium envs throughout; the small envs the tests need are defined and
registered here under ids no other test uses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from rlvitals.actors.agents import FixedActionAgent, RandomAgent
from rlvitals.actors.envs import AUTORESET_MODE, EnvError, make_vector_env
from rlvitals.actors.runner import EnvRunner, EnvStepError

_TAG = uuid.uuid4().hex[:8]
RLVITALS = str(Path(sys.executable).with_name("rlvitals")) if Path(sys.executable).with_name("rlvitals").exists() \
    else shutil.which("rlvitals")


def _register(name: str, **kwargs) -> str:
    env_id = f"RlvTest{name}{_TAG}-v0"
    if env_id not in gym.registry:
        gym.register(env_id, disable_env_checker=True, **kwargs)
    return env_id


# ---------------------------------------------------------------- test envs
TRUNCATE_AT = 4  # max_episode_steps of the counter env


def episode_plan(episode: int) -> tuple[int, bool]:
    """(length, terminated) of the counter env's episode `episode`.

    Even episodes terminate by themselves after 1, 2 or 3 steps; odd ones run
    until the TimeLimit wrapper truncates them after TRUNCATE_AT steps.
    """
    if episode % 2 == 0:
        return 1 + (episode // 2) % 3, True
    return TRUNCATE_AT, False


class CounterEnv(gym.Env):
    """Observation (episode index, step index); reward = step index of the observation acted on.

    The first reset's seed sets the first episode index, so the sub-envs of a
    vector env (seeds seed, seed+1, ...) run different episode schedules.
    """

    metadata = {"render_modes": []}

    def __init__(self):
        self.observation_space = spaces.Box(0.0, 1e6, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.episode = -1
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode = seed if seed is not None else self.episode + 1
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return np.array([self.episode, self.t], dtype=np.float32)

    def step(self, action):
        reward = float(self.t)
        self.t += 1
        length, terminates = episode_plan(self.episode)
        terminated = terminates and self.t >= length
        return self._obs(), reward, terminated, False, {}


class FaultyEnv(gym.Env):
    """Misbehaves in the way `fault` names once `fail_at` steps have gone by."""

    metadata = {"render_modes": []}

    def __init__(self, fault: str = "raise", fail_at: int = 3):
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.fault, self.fail_at, self.t = fault, fail_at, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        if self.fault == "reset_obs_shape":
            return np.zeros(3, dtype=np.float32), {}
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        obs, reward = np.zeros(2, dtype=np.float32), 0.0
        if self.t > self.fail_at:
            if self.fault == "raise":
                raise RuntimeError("the simulator fell over")
            if self.fault == "string_reward":
                reward = "lots"
            if self.fault == "none_reward":
                reward = None
            if self.fault == "obs_shape":
                obs = np.zeros(3, dtype=np.float32)
        return obs, reward, False, False, {}


class HandRolledVectorEnv(gym.vector.VectorEnv):
    """A user's own vector env: declares an autoreset mode; optionally returns bad observations or rewards."""

    def __init__(self, num_envs: int, autoreset_mode=AutoresetMode.NEXT_STEP, obs_dim: int = 2, reward=None, **_):
        self.num_envs = num_envs
        self.single_observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.single_action_space = spaces.Discrete(2)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": autoreset_mode}
        self.obs_dim = obs_dim
        self.reward = reward  # one value for every sub-env; None means proper zero rewards

    def reset(self, *, seed=None, options=None):
        return np.zeros((self.num_envs, 2), dtype=np.float32), {}

    def step(self, actions):
        n = self.num_envs
        rewards = np.zeros(n) if self.reward is None else [self.reward[0]] * n
        return np.zeros((n, self.obs_dim), dtype=np.float32), rewards, np.zeros(n, bool), np.zeros(n, bool), {}


COUNTER = _register("Counter", entry_point=CounterEnv, max_episode_steps=TRUNCATE_AT)


def _faulty(fault: str) -> str:
    return _register(f"Faulty{fault.title().replace('_', '')}", entry_point=FaultyEnv, kwargs={"fault": fault})


# ------------------------------------------------------------ (a) autoreset
@pytest.mark.parametrize("env_id", ["CartPole-v1", "rlvitals/Probe1-v0", COUNTER],
                         ids=["CartPole-v1", "Probe1-v0", "counter"])   # stable ids: the counter's is random
def test_vector_env_autoresets_next_step(env_id):
    env = make_vector_env(env_id, 3)
    try:
        assert env.num_envs == 3
        assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
        assert AUTORESET_MODE == AutoresetMode.NEXT_STEP
    finally:
        env.close()


def test_make_vector_env_rejects_other_autoreset_modes():
    same_step = _register("SameStep", entry_point=FaultyEnv,
                          vector_entry_point=lambda num_envs, **kw: HandRolledVectorEnv(
                              num_envs, autoreset_mode=AutoresetMode.SAME_STEP))
    with pytest.raises(EnvError, match="autoresets in mode .*NextStep"):
        make_vector_env(same_step, 2)
    # the same hand-rolled env declaring NEXT_STEP is accepted
    next_step = _register("NextStep", entry_point=FaultyEnv,
                          vector_entry_point=lambda num_envs, **kw: HandRolledVectorEnv(num_envs))
    make_vector_env(next_step, 2).close()


# --------------------------------------------------------- (b) bookkeeping
def expected_column(first_episode: int, steps: int) -> dict[str, list]:
    """What one sub-env of the counter env must produce over `steps` runner steps, from first principles."""
    out = {k: [] for k in ("obs", "reward", "terminated", "truncated", "valid")}
    episodes = []  # (return, length) of every episode that ends, in order
    episode, t, done = first_episode, 0, False
    for _ in range(steps):
        out["obs"].append((episode, t))
        if done:  # NEXT_STEP: this step only resets the env
            episode, t, done = episode + 1, 0, False
            out["reward"].append(0.0)
            out["terminated"].append(False)
            out["truncated"].append(False)
            out["valid"].append(False)
            continue
        length, terminates = episode_plan(episode)
        out["reward"].append(float(t))
        t += 1
        done = t >= length
        out["terminated"].append(done and terminates)
        out["truncated"].append(done and not terminates)
        out["valid"].append(True)
        if done:
            episodes.append((float(sum(range(length))), length))
    out["obs"].append((episode, t))
    out["episodes"] = episodes
    return out


def test_collect_pairs_rewards_with_observations_and_marks_resets():
    num_envs, seed, steps = 3, 10, (7, 13)  # two rollouts, so episodes span the boundary
    runner = EnvRunner(COUNTER, num_envs, seed)
    agent = RandomAgent(runner.action_space, seed=0)
    try:
        rollouts = [runner.collect(agent, n) for n in steps]
    finally:
        runner.close()
    first, second = rollouts
    assert torch.equal(first.obs[-1], second.obs[0]), "the next rollout must start where the last one stopped"

    obs = torch.cat([first.obs[:-1], second.obs]).numpy()
    rewards = torch.cat([r.rewards for r in rollouts]).numpy()
    terminated = torch.cat([r.terminated for r in rollouts]).numpy()
    truncated = torch.cat([r.truncated for r in rollouts]).numpy()
    valid = torch.cat([r.valid for r in rollouts]).numpy()
    T = sum(steps)
    assert obs.shape == (T + 1, num_envs, 2) and rewards.shape == (T, num_envs)

    # Structural checks first (clearer failures), then the exact expected trace.
    for t in range(T):
        for i in range(num_envs):
            episode, step = obs[t, i]
            if not valid[t, i]:
                assert rewards[t, i] == 0 and not terminated[t, i] and not truncated[t, i]
                assert tuple(obs[t + 1, i]) == (episode + 1, 0), \
                    "a reset step must lead to the next episode's first obs"
                continue
            assert rewards[t, i] == step, f"reward at t={t} env={i} is not paired with the obs it followed"
            assert tuple(obs[t + 1, i]) == (episode, step + 1), \
                "obs[t+1] must be the true next (for a done step: final) observation"
            assert not (terminated[t, i] and truncated[t, i])
            if terminated[t, i] or truncated[t, i]:
                length, terminates = episode_plan(int(episode))
                assert step + 1 == length
                assert terminated[t, i] == terminates and truncated[t, i] == (not terminates)
                if t + 1 < T:
                    assert not valid[t + 1, i], "the step after a done must be the reset transition"
            else:
                assert t + 1 >= T or valid[t + 1, i]
    assert truncated.any() and terminated.any() and (~valid).any(), "the schedule must exercise all three cases"
    # a truncated step's next observation is the final one (step TRUNCATE_AT), never the reset one
    rows, cols = np.nonzero(truncated)
    assert (obs[rows + 1, cols, 1] == TRUNCATE_AT).all()

    columns = [expected_column(seed + i, T) for i in range(num_envs)]
    for i, col in enumerate(columns):
        np.testing.assert_array_equal(obs[:, i], np.array(col["obs"], dtype=np.float32))
        np.testing.assert_array_equal(rewards[:, i], col["reward"])
        np.testing.assert_array_equal(terminated[:, i], col["terminated"])
        np.testing.assert_array_equal(truncated[:, i], col["truncated"])
        np.testing.assert_array_equal(valid[:, i], col["valid"])

    # Episode stats: exact, in (time, env) order, and split correctly between the two rollouts.
    ends = {}  # time step -> list of (env, return, length)
    for i, col in enumerate(columns):
        done_steps = [t for t in range(T) if col["terminated"][t] or col["truncated"][t]]
        assert len(done_steps) == len(col["episodes"])
        for t, (ret, length) in zip(done_steps, col["episodes"], strict=True):
            ends.setdefault(t, []).append((i, ret, length))
    for k, rollout in enumerate(rollouts):
        lo, hi = sum(steps[:k]), sum(steps[: k + 1])
        wanted = [e for t in sorted(ends) if lo <= t < hi for e in sorted(ends[t])]
        np.testing.assert_array_equal(rollout.episodes.returns, [e[1] for e in wanted])
        np.testing.assert_array_equal(rollout.episodes.lengths, [e[2] for e in wanted])
        assert rollout.env_steps == int(rollout.valid.sum())
        assert rollout.env_steps == sum(sum(c["valid"][lo:hi]) for c in columns)
        assert rollout.actions.shape == (rollout.num_steps, num_envs)
        assert rollout.behaviour_logp.shape == (rollout.num_steps, num_envs)


# --------------------------------------------------------- (c) module:EnvId
USER_MODULE = textwrap.dedent('''
    import gymnasium as gym
    import numpy as np
    from gymnasium import spaces


    class CoinEnv(gym.Env):
        """Five steps; reward 1 for action 1."""

        metadata = {"render_modes": []}

        def __init__(self):
            self.observation_space = spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
            self.action_space = spaces.Discrete(2)
            self.t = 0

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return np.zeros(3, dtype=np.float32), {}

        def step(self, action):
            self.t += 1
            return np.full(3, self.t / 5, dtype=np.float32), float(action), self.t >= 5, False, {}


    gym.register("{env_name}", entry_point=CoinEnv)
''')


@pytest.fixture
def user_env_module(tmp_path, monkeypatch):
    """A module in tmp_path that registers an env when imported; (module name, env name)."""
    module, env_name = f"rlv_user_envs_{_TAG}", f"RlvUserCoin{_TAG}-v0"
    (tmp_path / f"{module}.py").write_text(USER_MODULE.replace("{env_name}", env_name))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield module, env_name
    sys.modules.pop(module, None)
    gym.registry.pop(env_name, None)


def test_module_colon_env_id_imports_the_module(user_env_module):
    module, env_name = user_env_module
    assert env_name not in gym.registry
    env = make_vector_env(f"{module}:{env_name}", 2)
    try:
        assert env.num_envs == 2
        assert env.single_observation_space.shape == (3,)
        assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    finally:
        env.close()
    with pytest.raises(EnvError, match="cannot be imported"):
        make_vector_env(f"rlv_no_such_module_{_TAG}:{env_name}", 2)


def test_cli_trains_a_module_colon_env_id(user_env_module, tmp_path):
    from rlvitals.evaluate import evaluate_run

    module, env_name = user_env_module
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [RLVITALS, "train", "--env", f"{module}:{env_name}", "--total-env-steps", "256",
         "--num-envs", "4", "--rollout-length", "16", "--num-minibatches", "2", "--update-epochs", "1",
         "--run-dir", str(run_dir), "--verbosity", "off", "--progress", "false"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert (run_dir / "checkpoints" / "latest.pt").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 256
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["env"] == f"{module}:{env_name}"
    # the archived id still names the module, so evaluation can import it again once the caller names it
    result = evaluate_run(str(run_dir), 4, seed=3, env=f"{module}:{env_name}")
    assert result["env"] == f"{module}:{env_name}"
    assert result["episodes"] == 4 and 0 <= result["min"] <= result["max"] <= 5


# ------------------------------------------------------------- (d) errors
def _collect(env_id: str, steps: int = 6, seed: int = 42):
    runner = EnvRunner(env_id, 2, seed)
    try:
        return runner.collect(FixedActionAgent(runner.action_space, 1), steps)
    finally:
        runner.close()


def test_env_raising_in_step_names_env_seed_and_step():
    env_id = _faulty("raise")
    with pytest.raises(EnvStepError) as info:
        _collect(env_id, seed=42)
    message = str(info.value)
    assert env_id in message and "seed 42" in message and "step 3" in message
    assert "RuntimeError" in message and "the simulator fell over" in message
    assert "\n" not in message
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.parametrize("fault, words", [
    ("string_reward", "'lots'"),
    ("obs_shape", "shape"),
])
def test_unusable_step_results_are_one_line_errors(fault, words):
    env_id = _faulty(fault)
    with pytest.raises(EnvStepError) as info:
        _collect(env_id, seed=5)
    message = str(info.value)
    assert "\n" not in message
    assert env_id in message and "seed 5" in message and "step 3" in message and words in message


@pytest.mark.parametrize("name, reward, words", [
    ("NoneReward", (None,), "reward"),
    ("TextReward", ("lots",), "'lots'"),
])
def test_vector_env_returning_non_numeric_rewards_is_a_one_line_error(name, reward, words):
    # A gymnasium SyncVectorEnv turns a sub-env's None reward into NaN before the runner sees it,
    # so None is checked here through a vector env that hands its rewards over as they are.
    env_id = _register(name, entry_point=FaultyEnv,
                       vector_entry_point=lambda num_envs, **kw: HandRolledVectorEnv(num_envs, reward=reward))
    with pytest.raises(EnvStepError) as info:
        _collect(env_id, seed=4)
    message = str(info.value)
    assert "\n" not in message
    assert env_id in message and "seed 4" in message and "step 0" in message and words in message


def test_wrong_shaped_reset_observation_is_a_one_line_error():
    env_id = _faulty("reset_obs_shape")
    with pytest.raises(EnvStepError) as info:
        EnvRunner(env_id, 2, 9)
    message = str(info.value)
    assert "\n" not in message and env_id in message and "seed 9" in message


def test_vector_env_returning_wrong_shape_is_caught_by_the_runner():
    env_id = _register("WideObs", entry_point=FaultyEnv,
                       vector_entry_point=lambda num_envs, **kw: HandRolledVectorEnv(num_envs, obs_dim=5))
    with pytest.raises(EnvStepError) as info:
        _collect(env_id, seed=1)
    message = str(info.value)
    assert "\n" not in message and env_id in message and "seed 1" in message and "step 0" in message
    assert "(2, 5)" in message and "(2, 2)" in message


# ------------------------------------------------------- (e) probe agents
@pytest.mark.parametrize("action, reward", [(0, -1.0), (1, 1.0)])
def test_fixed_action_agent_earns_exactly_its_reward(action, reward):
    runner = EnvRunner("rlvitals/Probe4-v0", 4, seed=0)
    agent = FixedActionAgent(runner.action_space, action)
    try:
        rollout = runner.collect(agent, 20)
    finally:
        runner.close()
    assert (rollout.actions == action).all()
    assert rollout.rewards[rollout.valid].eq(reward).all()
    # one-step episodes: every other step is a reset transition
    assert rollout.env_steps == 40
    np.testing.assert_array_equal(rollout.episodes.returns, np.full(40, reward))
    np.testing.assert_array_equal(rollout.episodes.lengths, np.ones(40))


def test_fixed_action_agent_rejects_impossible_actions():
    runner = EnvRunner("rlvitals/Probe4-v0", 1, seed=0)
    runner.close()
    with pytest.raises(ValueError, match="fixed_action=2"):
        FixedActionAgent(runner.action_space, 2)


def test_random_agent_scores_like_random_on_cartpole():
    runner = EnvRunner("CartPole-v1", 16, seed=3)
    agent = RandomAgent(runner.action_space, seed=3)
    try:
        returns = np.concatenate([runner.collect(agent, 250).episodes.returns for _ in range(2)])
    finally:
        runner.close()
    assert len(returns) > 200
    assert 15 <= returns.mean() <= 30, returns.mean()
    # both actions are taken about equally often
    assert returns.min() >= 8 and returns.max() < 200


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_a_policy_on_another_device_samples_the_same_stream_as_the_network(env_id):
    """Local mode with a CUDA learner acts through DevicePolicy: the forward pass on the learner's device, the
    draw on the network's CPU generator (a CUDA forward pass with that generator crashed the first update on an
    H100). Here the device is the CPU, so the actions, parameters and log-probabilities must equal net.act's."""
    from rlvitals.config import TrainConfig
    from rlvitals.parts import DevicePolicy, env_spaces, make_network

    cfg = TrainConfig(env=env_id, seed=7).validate()
    obs_space, action_space = env_spaces(cfg)
    net, twin = make_network(cfg, obs_space, action_space), make_network(cfg, obs_space, action_space)
    twin.load_state_dict(net.state_dict())
    obs = torch.as_tensor(np.stack([obs_space.sample() for _ in range(16)]), dtype=torch.float32)
    for _ in range(3):   # the generators advance alike
        expected = net.act(obs)
        got = DevicePolicy(twin, torch.device("cpu")).act(obs)
        for a, b in zip(expected, got, strict=True):
            assert a.device.type == "cpu" and torch.equal(a, b)
