"""A recurrent policy through every surface: eval, load_policy().predict, checkpoints and resume, Ray, report.

One real recurrent run learns the memory probe (rlvitals/MemoryProbe-v0: name the cue seen four steps ago):
only a policy that carries its state from step to step can answer, so acting on it tells a surface that
carries the state (return near +1) from one that acts from the empty state at every step (0 on average).
The Ray cases join a private Ray head on loopback, as tests/test_ray.py's do.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import yaml
from test_ray import (  # noqa: F401  (fixtures: the module's private Ray head; no run outlives its test)
    REPLAY_UPDATES,
    STARTUP,
    TINY,
    finish,
    no_run_outlives_its_test,
    ray_address,
    train,
)

import rlvitals
from rlvitals.actors.runner import EnvRunner
from rlvitals.evaluate import open_checkpoint
from rlvitals.rows import MEASURED_KEYS, MODE_KEYS

CLI = [sys.executable, "-m", "rlvitals.cli"]
PROBE = "rlvitals/MemoryProbe-v0"
PROBE_RUN = ["--env", PROBE, "--recurrent-size", "16", "--num-envs", "8", "--rollout-length", "32",
             "--num-minibatches", "2", "--update-epochs", "4", "--seed", "1", "--verbosity", "off",
             "--progress", "false"]
PROBE_STEPS = 12_000
"""Env steps in which this recurrent policy learns the probe (last-100 return 0.96 at seed 1)."""
SOLVED = 0.9
"""A mean return the probe gives only to a policy that remembers the cue; acting without memory averages 0."""


def cli(*args, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, timeout=timeout)


def refused(proc: subprocess.CompletedProcess) -> str:
    """The one line of a refusal (exit 2)."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr)
    return lines[0]


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("recurrent") / "probe"
    done = cli("train", "--run-dir", run, "--total-env-steps", PROBE_STEPS, *PROBE_RUN)
    assert done.returncode == 0, done.stderr
    return run


@pytest.fixture(scope="module")
def feed_forward_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("feed_forward") / "cartpole"
    done = cli("train", "--env", "CartPole-v1", "--run-dir", run, "--total-env-steps", 512, "--num-envs", 4,
               "--rollout-length", 32, "--verbosity", "off", "--progress", "false")
    assert done.returncode == 0, done.stderr
    return run


class ActingWithoutMemory:
    """The network's flat calls: every step from the empty state, what eval did before it carried the state."""

    def __init__(self, net):
        self.net, self.age = net, net.age

    @torch.no_grad()
    def act(self, obs):
        params = self.net.policy_params(obs)
        actions = params.argmax(-1)
        return actions, params, self.net.dist.log_prob(params, actions)


# ------------------------------------------------------------------ eval
def test_eval_carries_the_state_per_env_greedy_and_sampled(probe_run):
    results = {}
    for mode in ("--greedy", "--sample"):
        done = cli("eval", "--run-dir", probe_run, "--episodes", 200, mode)
        assert done.returncode == 0, done.stderr
        results[mode] = json.loads(done.stdout)
    assert results["--greedy"]["greedy"] is True and results["--greedy"]["mean"] >= SOLVED, results
    assert results["--sample"]["greedy"] is False and results["--sample"]["mean"] >= SOLVED - 0.1, results

    # The same checkpoint acting from the empty state at every step cannot name the cue: about 0.
    net = open_checkpoint(probe_run).net
    runner = EnvRunner(PROBE, 16, seed=12345)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # as eval acts: one step of 16 envs is too small to split between threads
    try:
        returns = runner.collect(ActingWithoutMemory(net), 256).episodes.returns
    finally:
        torch.set_num_threads(threads)
        runner.close()
    assert len(returns) >= 200 and abs(returns.mean()) <= 0.5, returns.mean()


# ------------------------------------------------------------------ predict
def play(policy, episodes: int) -> float:
    """Mean return of `episodes` probe episodes, predict's state carried as sb3-contrib's docs carry it."""
    env = gym.make(PROBE)
    total = 0.0
    for episode in range(episodes):
        obs, _ = env.reset(seed=episode)
        state, start, done = None, True, False
        while not done:
            action, state = policy.predict(obs, state=state, episode_start=start)
            obs, reward, terminated, truncated, _ = env.step(action)
            total, start, done = total + reward, False, terminated or truncated
    return total / episodes


def test_predict_takes_and_returns_the_state_as_sb3_recurrent_ppo_does(probe_run):
    policy = rlvitals.load_policy(probe_run)
    assert policy.recurrent and policy.state_shape == (4, 16)   # (h, c) of the policy's core, then the value's
    assert play(policy, 50) >= SOLVED

    cues = np.array([[1.0], [-1.0], [1.0]], np.float32)
    actions, state = policy.predict(cues)                        # no state: the empty one
    assert actions.shape == (3,) and state.shape == (3, 4, 16) and state.dtype == np.float32
    one_action, one_state = policy.predict(cues[1], state=None)
    # Rows are separate envs (equal to float rounding: a batch of 3 multiplies in another order than 1).
    assert one_action == actions[1] and np.allclose(one_state, state[1], rtol=1e-5, atol=1e-6)
    # An episode start empties the state before the step: the same as passing no state.
    restarted = policy.predict(cues, state=state, episode_start=np.array([True, True, True]))
    assert np.array_equal(restarted[1], state)
    # Carried on, the state changes, and each env's only with its own observations.
    later = policy.predict(np.zeros((3, 1), np.float32), state=state)[1]
    mixed = policy.predict(np.zeros((3, 1), np.float32), state=state, episode_start=[False, True, False])[1]
    assert not np.array_equal(later, state)
    assert np.array_equal(mixed[[0, 2]], later[[0, 2]]) and not np.array_equal(mixed[1], later[1])
    policy.seed(0)
    drawn = policy.predict(cues, state=state, deterministic=False)
    policy.seed(0)
    again = policy.predict(cues, state=state, deterministic=False)
    assert np.array_equal(drawn[0], again[0]) and np.array_equal(drawn[1], again[1]), "seeded draws repeat"


@pytest.mark.parametrize("call, message", [
    (lambda p: p.predict(np.zeros(1, np.float32), state=np.zeros((3, 16))),
     "state of shape (3, 16) is invalid: expected one observation's state, shape (4, 16)"),
    (lambda p: p.predict(np.zeros((2, 1), np.float32), state=np.zeros((3, 4, 16))),
     "state of shape (3, 4, 16) is invalid: expected a batch of 2 observations' state, shape (2, 4, 16)"),
    (lambda p: p.predict(np.zeros(1, np.float32), state="h"),
     "state of type str is invalid: expected one observation's state, shape (4, 16)"),
    (lambda p: p.predict(np.zeros((2, 1), np.float32), episode_start=[True]),
     "episode_start of shape (1,) and dtype bool is invalid: expected an array of 2 bools, shape (2,)"),
], ids=["one observation", "batch", "not an array", "episode_start"])
def test_a_state_of_the_wrong_shape_is_one_line_naming_it_and_what_fits(probe_run, call, message):
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        call(rlvitals.load_policy(probe_run))
    assert "\n" not in str(caught.value)


def test_a_feed_forward_policy_keeps_returning_actions_alone_and_refuses_a_state(feed_forward_run):
    policy = rlvitals.load_policy(feed_forward_run)
    assert not policy.recurrent and policy.state_shape is None
    obs = np.zeros((5, 4), np.float32)
    actions = policy.predict(obs)
    assert isinstance(actions, np.ndarray) and actions.shape == (5,)
    assert np.array_equal(policy.predict(obs, episode_start=np.ones(5, bool)), actions)   # no memory to empty
    with pytest.raises(ValueError, match=re.escape("state of type ndarray is invalid: this policy is feed-forward "
                                                   "(recurrent_size=0) and carries no state; expected state=None")):
        policy.predict(obs, state=np.zeros((5, 2, 16)))


# ------------------------------------------------------------------ checkpoints and resume
def test_a_resumed_recurrent_run_restores_its_weights_and_trains_on(probe_run, tmp_path):
    run = tmp_path / "resumed"
    shutil.copytree(probe_run, run)
    before = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)["tracker"]["updates"]
    done = cli("train", "--resume", run, "--total-env-steps", PROBE_STEPS + 2048)
    assert done.returncode == 0, done.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["updates"] > before, summary
    assert summary["env_steps"] >= PROBE_STEPS + 2048 and summary["nonfinite_batches_skipped"] == 0, summary
    # The weights came back: the resumed network still names the cue (a fresh one would average 0).
    assert play(rlvitals.load_policy(run), 30) >= SOLVED


def test_a_different_recurrent_size_is_refused_in_one_line_naming_the_field(probe_run, tmp_path):
    line = refused(cli("train", "--resume", probe_run, "--recurrent-size", 32))
    assert line.startswith("rlvitals: error: recurrent_size cannot change when resuming (the run has "
                           "recurrent_size=16;"), line

    edited = tmp_path / "edited"
    shutil.copytree(probe_run, edited)
    config = yaml.safe_load((edited / "config.yaml").read_text())
    (edited / "config.yaml").write_text(yaml.safe_dump({**config, "recurrent_size": 32}))
    line = refused(cli("train", "--resume", edited))
    assert "was written with recurrent_size=16 but run" in line and "has recurrent_size=32 in config.yaml" in line

    # A checkpoint whose config names another width than its network holds: named, not blamed on the env.
    state = torch.load(probe_run / "checkpoints" / "latest.pt", weights_only=True)
    for configured in (32, 0):
        path = tmp_path / f"recurrent_size_{configured}.pt"
        torch.save({**state, "config": {**state["config"], "recurrent_size": configured}}, path)
        expected = (f"checkpoint {str(path)!r} holds a network of recurrent_size=16 but its config has "
                    f"recurrent_size={configured}")
        with pytest.raises(ValueError, match=re.escape(expected)):
            rlvitals.load_policy(None, checkpoint=str(path))
    assert expected in refused(cli("eval", "--checkpoint", path, "--episodes", 1))


# ------------------------------------------------------------------ report and runs
def test_report_and_runs_read_a_recurrent_run(probe_run, tmp_path):
    page = tmp_path / "report.html"
    done = cli("report", probe_run, "-o", page)
    assert done.returncode == 0, done.stderr
    assert "<td>LSTM 16</td>" in page.read_text()
    listed = cli("runs", probe_run.parent, "--filter", "recurrent_size=16")
    assert listed.returncode == 0, listed.stderr
    assert probe_run.name in listed.stdout and PROBE in listed.stdout
    assert probe_run.name not in cli("runs", probe_run.parent, "--filter", "recurrent_size=0").stdout


# ------------------------------------------------------------------ Ray
RECURRENT = ["--recurrent-size", "8"]


@pytest.mark.slow
def test_one_actor_sync_replays_local_mode_with_a_recurrent_policy(ray_address, tmp_path):  # noqa: F811
    """Bit for bit over 60 updates, rows and final weights, with the state carried across rollouts: the
    approach of tests/test_ray.py's test_one_actor_sync_replays_local_mode, on the masked-velocity CartPole."""
    common = ["--env", "rlvitals/CartPoleNoVelocity-v1", "--total-env-steps", str(REPLAY_UPDATES * 4 * 16),
              "--seed", "3", "--verbosity", "off", "--progress", "false", *TINY, *RECURRENT]
    local = cli("train", "--mode", "local", "--run-dir", tmp_path / "local", *common)
    assert local.returncode == 0, local.stderr
    finish(train(["--mode", "ray", "--address", ray_address, "--num-actors", "1", "--sync", "true",
                  "--run-dir", str(tmp_path / "ray"), *STARTUP, *common]))

    def curve(name):
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in row.items() if k not in MEASURED_KEYS + MODE_KEYS} for row in rows]

    def final_weights(name):
        return torch.load(tmp_path / name / "checkpoints" / "latest.pt", weights_only=True)["network"]

    assert curve("local")[-1]["updates"] >= REPLAY_UPDATES
    assert curve("ray") == curve("local")
    local_net, ray_net = final_weights("local"), final_weights("ray")
    assert any(k.startswith("cores.") for k in local_net) and local_net.keys() == ray_net.keys()
    changed = [k for k in local_net if not torch.equal(local_net[k], ray_net[k])]
    assert changed == [], f"final weights differ in {changed}"


@pytest.mark.slow
def test_two_async_actors_train_a_recurrent_policy_on_states_older_weights_computed(ray_address,  # noqa: F811
                                                                                     tmp_path):
    run = tmp_path / "async"
    summary, _ = finish(train(["--mode", "ray", "--address", ray_address, "--num-actors", "2",
                               "--run-dir", str(run), *STARTUP, "--env", PROBE, "--total-env-steps", "4000",
                               "--seed", "2", "--verbosity", "off", "--progress", "false", *TINY, *RECURRENT]))
    assert summary["status"] == "completed" and summary["mode"] == "ray", summary
    assert summary["samples"]["learned"] > 0 and summary["judgement"]["invariants_broken"] == {}, summary
    staleness = [json.loads(line).get("staleness") for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(s for s in staleness if s is not None) > 0, "no batch was stale: nothing replayed an older state"
    # Its checkpoint is a recurrent policy's, which eval acts with as it does a local run's.
    evaluated = cli("eval", "--run-dir", run, "--episodes", 20)
    assert evaluated.returncode == 0, evaluated.stderr
