"""A slower machine, simulated: the env, the actor and the learner each take `factor` times as long.

Verdicts count evidence (updates, samples), so a run on a machine half as fast
must reach the same ones at the same updates. To show it, every collection
(env and actor) and every learner update sleeps for `factor - 1` times what it
took. In Ray mode the actors live in Ray's worker processes, which a
monkeypatch here does not reach: `planted_bugs.plant_in_ray_workers` passes the
factor to them in the environment and its set-up hook calls `slow_from_env`.
"""

from __future__ import annotations

import functools
import os
import time

import pytest

SLOWDOWN_ENV = "RLVITALS_TEST_SLOWDOWN"


def _slowed(original, factor: float):
    @functools.wraps(original)
    def slowed(*args, **kwargs):
        started = time.perf_counter()
        out = original(*args, **kwargs)
        time.sleep((factor - 1) * (time.perf_counter() - started))
        return out
    return slowed


def slow_down(mp: pytest.MonkeyPatch, factor: float) -> None:
    """Every collection and every learner update takes `factor` times as long, in this process."""
    from rlvitals.actors.runner import EnvRunner
    from rlvitals.learner.ppo import PPOLearner

    if factor == 1.0:
        return
    mp.setattr(EnvRunner, "collect", _slowed(EnvRunner.collect, factor))
    mp.setattr(PPOLearner, "learn", _slowed(PPOLearner.learn, factor))


def slow_from_env() -> None:
    """Ray worker set-up hook's half: slow this worker process down by the factor in the environment."""
    factor = float(os.environ.get(SLOWDOWN_ENV, "1"))
    if factor != 1.0:
        slow_down(pytest.MonkeyPatch(), factor)
