"""The Python API: `rlvitals.train` and `rlvitals.load_policy(...).predict`, and the README's example run as written.

Real training runs (short CartPole and Pendulum runs), real checkpoints, a real env; the README's
code block is executed in a subprocess in an empty directory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml

import rlvitals
from rlvitals.config import ConfigError, TrainConfig
from rlvitals.learner.networks import ActorCritic
from rlvitals.learner.normalize import EPSILON

README = Path(__file__).parents[1] / "README.md"
SMALL = {"num_envs": 4, "rollout_length": 32, "update_epochs": 1, "num_minibatches": 2, "verbosity": "off",
         "progress": False}


def test_import_rlvitals_is_cheap_and_offers_the_api_on_first_use():
    code = ("import sys, rlvitals\n"
            "def heavy(): return sorted(m for m in ('torch', 'gymnasium', 'ray', 'yaml') if m in sys.modules)\n"
            "print(heavy(), rlvitals.train.__module__, rlvitals.load_policy.__module__, heavy())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # Nothing heavy on import; the API's names load its module and the config's YAML, torch only when used.
    assert done.stdout.split() == ["[]", "rlvitals.api", "rlvitals.api", "['yaml']"]
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        rlvitals.nothing_here  # noqa: B018


# ------------------------------------------------------------------ config: the command line's rules
def test_config_layers_and_types_are_read_as_the_command_line_reads_them(tmp_path, monkeypatch):
    monkeypatch.delenv("RLVITALS_VERBOSITY", raising=False)
    cfg = rlvitals.make_config(TrainConfig(seed=3, num_envs=8), learning_rate="1e-3", hidden_sizes="32,32")
    assert (cfg.seed, cfg.num_envs, cfg.learning_rate, cfg.hidden_sizes) == (3, 8, 0.001, (32, 32))
    assert rlvitals.make_config({"seed": "5", "anneal_lr": "false"}, seed=6).seed == 6
    assert rlvitals.make_config({"anneal_lr": "false"}).anneal_lr is False
    monkeypatch.setenv("RLVITALS_VERBOSITY", "debug")
    assert rlvitals.make_config().verbosity == "debug"           # the environment, where nothing else says
    assert rlvitals.make_config(verbosity="minimal").verbosity == "minimal"
    path = tmp_path / "my.yaml"
    path.write_text("verbosity: minimal\nseed: 9\n")
    assert (rlvitals.make_config(path).verbosity, rlvitals.make_config(str(path), seed=1).seed) == ("minimal", 1)


@pytest.mark.parametrize("config, fields, error, names", [
    (None, {"learning_rate": "abc"}, ConfigError, ["learning_rate='abc'", "number"]),
    ({"gamma": 1.5}, {}, ConfigError, ["gamma=1.5", "[0, 1]"]),
    (None, {"bogus_field": 1}, ConfigError, ["'bogus_field'", "expected one of"]),
    (42, {}, ConfigError, ["config=42", "TrainConfig", "YAML"]),
    ("{tmp}/missing.yaml", {}, ConfigError, ["missing.yaml'", "unreadable"]),
    (None, {"keep_checkpoints": -1}, ConfigError, ["keep_checkpoints=-1", ">= 0"]),
    (None, {"env": "CartPol-v1"}, ValueError, ["env='CartPol-v1'", "CartPole-v1"]),
    (None, {"run_dir": "{tmp}/full"}, ConfigError, ["full'", "not empty"]),
], ids=["not-a-number", "gamma-in-dict", "unknown-field", "config-not-a-config", "yaml-missing",
        "keep-negative", "env-misspelt", "run-dir-not-empty"])
def test_train_refuses_bad_values_in_one_line_before_writing_anything(tmp_path, monkeypatch, config, fields, error,
                                                                      names):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    fields = {"run_dir": str(tmp_path / "run"), **{k: str(v).replace("{tmp}", str(tmp_path)) if isinstance(v, str)
                                                   else v for k, v in fields.items()}}
    if isinstance(config, str):
        config = config.replace("{tmp}", str(tmp_path))
    with pytest.raises(error) as caught:
        rlvitals.train(config, **fields)
    message = str(caught.value)
    assert "\n" not in message
    for name in names:
        assert name in message, f"{name!r} missing from {message!r}"
    assert sorted(p.name for p in tmp_path.rglob("*")) == before, "nothing may be written"


# ------------------------------------------------------------------ train, then predict
@pytest.fixture(scope="module")
def cartpole(tmp_path_factory) -> tuple[Path, dict]:
    """A YAML file's config with a field overriding it, trained from a worker thread (no signal handlers there)."""
    root = tmp_path_factory.mktemp("api")
    path = root / "cartpole.yaml"
    path.write_text(yaml.safe_dump({"env": "CartPole-v1", "seed": 4, "learning_rate": 0.01, **SMALL}))
    out: dict = {}
    worker = threading.Thread(target=lambda: out.update(summary=rlvitals.train(
        path, learning_rate=0.002, total_env_steps=2048, run_dir=str(root / "run"))))
    worker.start()
    worker.join(timeout=240)
    assert "summary" in out, "training in a worker thread did not finish"
    return root / "run", out["summary"]


@pytest.mark.slow
def test_train_returns_the_summary_the_run_wrote_with_fields_over_the_file(cartpole):
    run, summary = cartpole
    assert summary["status"] == "completed" and summary["env_steps"] >= 2048
    assert summary == json.loads((run / "summary.json").read_text())
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert (config["seed"], config["learning_rate"], config["num_envs"]) == (4, 0.002, 4)
    assert json.loads((run / "meta.json").read_text())["command"][-1] == "rlvitals.train()"


@pytest.mark.slow
def test_predict_takes_one_observation_or_a_batch_and_acts_greedily_by_default(cartpole):
    run, _ = cartpole
    policy = rlvitals.load_policy(run, checkpoint="best")
    assert policy.checkpoint == run / "checkpoints" / "best.pt"
    assert policy.updates == torch.load(policy.checkpoint, weights_only=True)["tracker"]["updates"]
    env = gym.make("CartPole-v1")
    obs = np.stack([env.reset(seed=s)[0] for s in range(256)]) * np.float32(8)  # spread: both actions appear
    greedy = policy.predict(obs)
    assert greedy.shape == (256,) and greedy.dtype == np.int64 and set(greedy.tolist()) == {0, 1}
    assert [int(policy.predict(o)) for o in obs[:16]] == greedy[:16].tolist()
    logits = policy.net.policy_params(torch.from_numpy(obs))
    assert greedy.tolist() == logits.argmax(-1).tolist()
    policy.seed(0)
    sampled = policy.predict(obs, deterministic=False)
    policy.seed(0)
    assert (policy.predict(obs, deterministic=False) == sampled).all(), "seeded draws repeat"
    assert (sampled != greedy).any(), "sampling must differ from the most likely action somewhere"
    assert env.action_space.contains(policy.predict(obs[0]))
    with pytest.raises(ValueError, match=re.escape("one observation of shape (4,) or a batch of shape (N, 4)")):
        policy.predict(np.zeros(3))
    with pytest.raises(ValueError, match="checkpoint='update-999999' is not in"):
        rlvitals.load_policy(run, checkpoint="update-999999")


def test_predict_normalises_observations_as_the_run_did_and_takes_the_gaussian_mean(tmp_path, monkeypatch):
    monkeypatch.delenv("RLVITALS_VERBOSITY", raising=False)
    run = tmp_path / "pendulum"
    rlvitals.train(env="Pendulum-v1", total_env_steps=1024, normalize_observations=True, run_dir=str(run), **SMALL)
    policy = rlvitals.load_policy(str(run))
    state = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["network"]
    mean, var = state["obs_normalizer.mean"].numpy(), state["obs_normalizer.var"].numpy()
    assert float(state["obs_normalizer.count"]) > 0 and np.abs(mean).max() > 0.01, "no statistics: proves nothing"

    # Reference: the same weights without the normaliser, fed observations normalised here by the formula.
    plain = ActorCritic(policy.observation_space, policy.action_space, policy.config.hidden_sizes)
    plain.load_state_dict({k: v for k, v in state.items() if not k.startswith("obs_normalizer.")})
    space = policy.observation_space
    obs = np.random.default_rng(0).uniform(space.low, space.high, (64, *space.shape)).astype(np.float32)
    clip = policy.config.normalize_clip
    scaled = np.clip((obs - mean) / np.sqrt(var + EPSILON), -clip, clip).astype(np.float32)
    with torch.no_grad():
        expected = plain.policy_params(torch.from_numpy(scaled))[:, :1].numpy()
        unnormalised = plain.policy_params(torch.from_numpy(obs))[:, :1].numpy()
    low, high = policy.action_space.low, policy.action_space.high
    actions = policy.predict(obs)
    assert actions.shape == (64, 1) and actions.dtype == np.float32
    np.testing.assert_allclose(actions, np.clip(expected, low, high), rtol=1e-5, atol=1e-6)
    assert not np.allclose(expected, unnormalised, atol=1e-4), "normalising changes nothing here: proves nothing"
    assert policy.predict(obs[0]).shape == (1,)
    sampled = policy.predict(obs, deterministic=False)
    assert (sampled >= low).all() and (sampled <= high).all() and not np.allclose(sampled, actions)


# ------------------------------------------------------------------ the README's example
def readme_example() -> str:
    text = README.read_text()
    section = text[text.index("\n### Python API\n"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's Python API section has no ```python block"
    return match.group(1)


@pytest.mark.slow
def test_the_readme_python_api_example_runs_as_written(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLVITALS_")}
    done = subprocess.run([sys.executable, "-c", readme_example()], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    status, *_ = done.stdout.split()
    assert status == "completed", done.stdout
    lines = done.stdout.strip().splitlines()
    assert lines[-1].startswith("greedy return ") and float(lines[-1].split()[-1]) >= 1, done.stdout
    assert (tmp_path / "runs" / "api-demo" / "checkpoints" / "best.pt").is_file()
