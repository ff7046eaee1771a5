"""A resumed run starts from exactly the state its checkpoint was saved from (telemetry/invariants_resume.py):
real runs, real checkpoints, real resumes; each fault breaks one part of the resume (a monkeypatch, never in
product code) and the verdict names the part's owner at the first update after the resume."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import gymnasium as gym
import pytest
import torch

from rlvitals.api import load_policy
from rlvitals.archive import RunArchive
from rlvitals.checkpoint import restore
from rlvitals.config import TrainConfig
from rlvitals.learner.networks import ActorCritic
from rlvitals.learner.ppo import PPOLearner
from rlvitals.parts import make_learner, make_network
from rlvitals.resume_check import OWNERS, resume_gaps
from rlvitals.session import run_training, train_in
from rlvitals.telemetry.invariants import BY_NAME
from rlvitals.tracker import RunTracker

UPDATES = 4


def settings(tmp_path, updates: int) -> TrainConfig:
    # Observation and reward normalisation on: every owner of the state has something to lose.
    return TrainConfig(env="Pendulum-v1", num_envs=4, rollout_length=64, total_env_steps=4 * 64 * updates,
                       checkpoint_interval=1, progress=False, run_dir=str(tmp_path / "run"),
                       normalize_observations=True, normalize_rewards=True).validate()


def resumed(tmp_path, plant=None):
    """A run of about UPDATES updates, resumed for 3 more (with `plant(mp)` in force during the resume): (the
    update the resume began at, its rows after the resume, its verdicts)."""
    cfg = settings(tmp_path, UPDATES)
    _, path = train_in(cfg, ["test"])
    state = RunArchive(path).load_checkpoint()
    saved_at = state["tracker"]["updates"]   # the budget counts agent steps: the run may take one update more
    with pytest.MonkeyPatch.context() as mp:
        if plant is not None:
            plant(mp)
        run_training(settings(tmp_path, saved_at + 3), ["test", "--resume"], resume=state)
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return saved_at, [r for r in rows if r.get("updates", 0) > saved_at], json.loads(
        (path / "verdicts.json").read_text())


def test_a_healthy_resume_reads_zero_for_every_owner_and_raises_nothing(tmp_path):
    _, rows, verdicts = resumed(tmp_path)
    first = next(r for r in rows if OWNERS["weights"] in r)
    assert all(first[key] == 0.0 for key in OWNERS.values())
    assert not [v for v in verdicts if v["severity"] in ("warning", "critical")]


def optimizer_state_not_loaded(mp):
    mp.setattr(torch.optim.Optimizer, "load_state_dict", lambda self, state: None)   # moments restart at zero


def observation_statistics_not_loaded(mp):
    original = ActorCritic.load_state_dict

    def load_state_dict(self, state_dict, strict=True, assign=False):
        kept = {k: v for k, v in state_dict.items() if not k.startswith("obs_normalizer.")}
        return original(self, {**self.state_dict(), **kept}, strict, assign)
    mp.setattr(ActorCritic, "load_state_dict", load_state_dict)


def learner_counters_not_loaded(mp):
    original = PPOLearner.load_extra_state

    def load_extra_state(self, state):
        original(self, {k: v for k, v in state.items() if k != "reward_scale"})   # the run's reward scale restarts
    mp.setattr(PPOLearner, "load_extra_state", load_extra_state)


@pytest.mark.parametrize("plant, invariant", [
    (optimizer_state_not_loaded, "resumed_optimizer_as_saved"),
    (observation_statistics_not_loaded, "resumed_preprocessing_as_saved"),
    (learner_counters_not_loaded, "resumed_weights_as_saved"),
])
def test_a_resume_that_loses_a_part_is_named_on_its_owner_at_once(tmp_path, plant, invariant):
    saved_at, rows, verdicts = resumed(tmp_path, plant)
    loud = [v for v in verdicts if v["severity"] in ("warning", "critical")]
    assert loud, "the resume's fault raised nothing"
    first = loud[0]
    assert first["rule"] == BY_NAME[invariant].rule_name and first["component"] == BY_NAME[invariant].component
    assert first["first_update"] == saved_at + 1
    assert rows[0]["updates"] == saved_at + 1 and rows[0][BY_NAME[invariant].statistic] > 0   # the first row
    reading = next(r for r in rows if BY_NAME[invariant].statistic in r)
    assert reading[BY_NAME[invariant].statistic] > BY_NAME[invariant].limit
    others = [key for key in OWNERS.values() if key != BY_NAME[invariant].statistic]
    assert all(reading[key] == 0.0 for key in others), "only the part that was lost differs"


def test_the_gaps_by_hand():
    saved = {"weights": [2.0, 4.0], "optimizer": [1.0], "preprocessing": [0.0, 3.0]}
    assert resume_gaps(None, saved) == {} and resume_gaps({}, saved) == {}   # a checkpoint from before the check
    now = {"weights": [2.0, 5.0], "optimizer": [1.0, 0.0], "preprocessing": [1e-40, 3.0]}
    gaps = resume_gaps(saved, now)
    assert gaps[OWNERS["weights"]] == pytest.approx(0.25)            # |4 - 5| / 4
    assert gaps[OWNERS["optimizer"]] == 1.0                          # a part present in one only
    assert gaps[OWNERS["preprocessing"]] == pytest.approx(1e-10)     # from 0: relative to 1e-30
    assert all(not math.isnan(v) for v in gaps.values())


def test_restore_returns_nothing_to_judge_for_a_checkpoint_without_a_fingerprint(tmp_path):
    cfg = settings(tmp_path, 2)
    _, path = train_in(cfg, ["test"])
    state = RunArchive(path).load_checkpoint()
    state.pop("fingerprint")
    env = gym.make(cfg.env)
    net = make_network(cfg, env.observation_space, env.action_space)
    learner = make_learner(cfg, net, torch.device("cpu"))
    assert restore(state, net, learner, RunTracker(cfg.total_env_steps, cfg.return_threshold)) == {}


# ------------------------------------------------------------------ a network loaded for acting (eval, load_policy)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("saved")
    _, path = train_in(settings(tmp, 2), ["test"])
    return path


def test_a_checkpoint_loads_for_acting_as_it_was_saved(saved_run):
    policy = load_policy(saved_run)
    assert policy is not None


def test_a_load_that_leaves_the_normaliser_at_its_initial_values_is_refused_naming_it(saved_run):
    with pytest.MonkeyPatch.context() as mp:
        observation_statistics_not_loaded(mp)
        with pytest.raises(ValueError, match=r"differs from the one saved \(preprocessing: relative gap"):
            load_policy(saved_run)


def test_eval_refuses_a_checkpoint_whose_weights_changed_since_it_was_written(saved_run, tmp_path):
    changed = tmp_path / "changed.pt"
    state = torch.load(saved_run / "checkpoints" / "latest.pt", weights_only=True)
    name = next(k for k, v in state["network"].items() if v.is_floating_point() and "normalizer" not in k)
    state["network"][name] = state["network"][name] + 1e-3
    torch.save(state, changed)
    result = subprocess.run([sys.executable, "-m", "rlvitals.cli", "eval", "--checkpoint", str(changed),
                             "--episodes", "1"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "differs from the one saved (weights: relative gap" in lines[0], result.stderr
