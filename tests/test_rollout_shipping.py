"""A rollout crosses processes (Ray) as numpy arrays: out of band under pickle protocol 5, exact on arrival."""

from __future__ import annotations

import pickle

import torch

from rlvitals.actors.rollout import Rollout
from rlvitals.actors.runner import EnvRunner
from rlvitals.config import TrainConfig
from rlvitals.parts import make_network

TENSORS = ("obs", "actions", "rewards", "terminated", "truncated", "valid", "behaviour_params", "behaviour_logp")


def collected() -> Rollout:
    cfg = TrainConfig(env="CartPole-v1", num_envs=4, rollout_length=16).validate()
    runner = EnvRunner(cfg.env, cfg.num_envs, 0)
    try:
        return runner.collect(make_network(cfg, runner.obs_space, runner.action_space), cfg.rollout_length)
    finally:
        runner.close()


def test_rollout_tensors_travel_out_of_band_and_arrive_exact_and_writable():
    rollout = collected()
    buffers = []
    blob = pickle.dumps(rollout, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) >= len(TENSORS)   # every tensor handed over as a buffer, none copied into the pickle
    # As Ray hands them back: read-only views of its shared store.
    alive = Rollout.alive()
    back = pickle.loads(blob, buffers=[memoryview(b.raw()).toreadonly() for b in buffers])
    assert Rollout.alive() == alive + 1   # an arriving rollout is counted like a collected one
    for name in TENSORS:
        sent, got = getattr(rollout, name), getattr(back, name)
        assert isinstance(got, torch.Tensor) and got.dtype == sent.dtype and torch.equal(got, sent), name
        got.zero_() if got.dtype != torch.bool else got.fill_(False)   # the learner's own copy: writable
    assert (back.policy_age, back.valid_count, back.timings) == (rollout.policy_age, rollout.valid_count,
                                                                 rollout.timings)
    assert torch.equal(rollout.obs, pickle.loads(pickle.dumps(rollout)).obs)   # plain pickling still works
