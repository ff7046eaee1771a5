"""streams_independent: envs seeded alike replay each other's episodes, and the run names the actor.

Synthetic batches pin the statistic (duplicates counted only where chance cannot explain them); a real run of
Acrobot whose vector env resets every sub-env with one seed is named on the actor; a restarted Ray actor
draws new seeds (the ledger gives each incarnation its number)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from diagnose import diagnose
from planted_bugs import BY_BUG

from rlvitals.actors.streams import RESETS, StreamIndependence
from rlvitals.distributed.workers import IncarnationLedger
from rlvitals.telemetry.invariants import BY_NAME

STEPS = 7   # each column resets every 7th step


class Batch:
    """The fields StreamIndependence reads: obs [T+1, N, d], valid [T, N], the actors' counters."""

    def __init__(self, obs: np.ndarray, owners=()):
        T = obs.shape[0] - 1
        valid = np.ones((T, obs.shape[1]), dtype=bool)
        valid[STEPS - 1::STEPS] = False                  # obs[t+1] after an invalid step is a reset observation
        self.obs, self.valid = torch.from_numpy(obs), torch.from_numpy(valid)
        self.actor_counters = tuple({"actor": a, "pid": p} for a, p in owners)


def episodes(rng, columns: int, d: int = 4, resets=RESETS) -> np.ndarray:
    return rng.uniform(-0.05, 0.05, size=(STEPS * resets + 1, columns, d)).astype(np.float32)


def test_independent_streams_read_zero_and_duplicated_ones_count_their_pairs():
    rng = np.random.default_rng(0)
    independent = StreamIndependence()
    assert independent.observe(Batch(episodes(rng, 8)))["inv_streams_independent"] == 0.0
    duplicated = StreamIndependence()
    obs = episodes(rng, 8)
    obs[:, 5] = obs[:, 2]
    obs[:, 6] = obs[:, 2]                                 # three streams alike: three pairs
    assert duplicated.observe(Batch(obs))["inv_streams_independent"] == 3.0
    assert duplicated.duplicates() == [[(0, 0, 2), (0, 0, 5), (0, 0, 6)]]


def test_nothing_is_judged_before_the_signatures_are_complete():
    rng = np.random.default_rng(1)
    obs = episodes(rng, 4, resets=RESETS - 1)
    obs[:, 1] = obs[:, 0]
    assert math.isnan(StreamIndependence().observe(Batch(obs))["inv_streams_independent"])


def test_envs_with_a_fixed_or_few_valued_start_are_not_judged():
    rng = np.random.default_rng(2)
    fixed = np.zeros((STEPS * RESETS + 1, 8, 3), np.float32)           # a probe: every episode starts alike
    assert StreamIndependence().observe(Batch(fixed))["inv_streams_independent"] == 0.0
    coin = rng.choice([-1.0, 1.0], size=(STEPS * RESETS + 1, 64, 1)).astype(np.float32)  # two start states
    assert StreamIndependence().observe(Batch(coin))["inv_streams_independent"] == 0.0


def test_ray_streams_are_told_apart_by_actor_and_incarnation():
    rng = np.random.default_rng(3)
    first = episodes(rng, 4)
    same_life = np.concatenate([first, first], axis=1)                 # two actors, seeded alike
    judge = StreamIndependence()
    assert judge.observe(Batch(same_life, owners=[(0, 10), (1, 11)]))["inv_streams_independent"] == 4.0
    assert {s[:2] for group in judge.duplicates() for s in group} == {(0, 10), (1, 11)}
    ledger = IncarnationLedger()
    assert [ledger.started(0, 10), ledger.started(1, 11), ledger.started(0, 12)] == [0, 0, 1]


@pytest.mark.slow
def test_a_vector_env_seeded_with_one_seed_is_named_on_the_actor(tmp_path):
    bug = BY_BUG["vector_envs_share_one_seed"]
    found = diagnose(tmp_path / "run", env=bug.env, bug=bug, budget_s=600, total_env_steps=60_000)
    invariant = BY_NAME["streams_independent"]
    loud = [v for v in found.verdicts if v.severity != "info"]
    assert loud and (loud[0].rule, loud[0].component) == (invariant.rule_name, "actor"), found.verdicts
