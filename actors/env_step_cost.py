"""The reference cost of an actor's env-step phase: one step of a separate copy of the env, as gymnasium builds it,
timed in the actor's own thread.

The env-step phase of a rollout (`timings["env_step_cpu"]`) is everything from handing the actions to the vector
env to holding its checked rewards: the env's own step, the wrappers the project puts around it (the witness
below everything, its time-limit probes, space checks) and the runner's check of the rewards. The reference is
what a correct phase must spend: a copy built by gymnasium from the run's arguments as `make_vector_env` asks it
to (`gymnasium_vector_env`: the same id, count, constructor arguments and autoreset mode, Atari's standard
preprocessing included) under the project's own witness (actors/witness.py), stepped with random actions. The
witness is in the reference because on a tiny pure-Python env (a one-hot corridor, the memory probe) it costs
as much as the env's step itself: without it a healthy run of such an env read over 2.5. Each timed step of the
copy follows an untimed forward pass of the policy, as each of a rollout's steps follows its inference: stepped
back to back, the copy met warm caches and a tiny env's healthy phase read 1.5 to 2.2 over it (1.1 to 1.2 with
the forward between). So a healthy phase
reads near 1 for every env; work per env step hidden in the runner's phase or in any wrapper put around what
`make_vector_env` returns (a per-env Python loop, a copy of every observation) reads as a factor. The witness's
own work is held to its invariants, not to this reference.

The run's own envs are never stepped for this: that would change their state, and a local run and a Ray run with
one actor must stay bit-identical. The copy has its own seed and its own action space's generator, and the global
random generators (Python's, numpy's, torch's) are put back after each measurement, so an env that draws from
them changes nothing the run sees. Both sides are CPU seconds of the stepping thread (`time.thread_time`): time
descheduled (eight Ray actors on two cores) and other threads of the process (Ray's own, a /metrics scrape) count
in neither. An env that cannot be built or stepped a second time gives no reference, and the run goes on.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

from .env_contract import AUTORESET_MODE

log = logging.getLogger("rlvitals.actors")

EVERY = 16
"""Measure every this many rollouts (and on the first)."""
STEPS = 8
"""Env steps per measurement: with EVERY, under 1% of the steps a 128-step rollout takes."""
KEPT = 4
"""The reference is the cheapest step of this many latest measurements: robust to a pause, quick to follow a slower
machine."""
SEED_OFFSET = 7_919
"""The copy's seed is the runner's plus this: its own episodes, never the run's."""


def gymnasium_vector_env(env_id: str, num_envs: int, atari_options=None, env_kwargs=None) -> gym.vector.VectorEnv:
    """The vector env gymnasium builds for `make_vector_env`'s arguments, without anything the project wraps around
    it (the witness, its probes): what one env step costs before any project code runs."""
    from . import atari
    from .envs import resolve_env_id

    env_id = resolve_env_id(env_id)
    spec = gym.spec(env_id)
    if atari.is_atari(spec):
        return atari.make_atari_vector_env(env_id, num_envs, atari_options, dict(env_kwargs or {}))
    if spec.vector_entry_point is not None:
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **(env_kwargs or {}))
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": AUTORESET_MODE}, **(env_kwargs or {}))


class EnvStepCost:
    def __init__(self, build: Callable[[], object], seed: int):
        """`build()`: a new vector env as gymnasium builds it for this runner (`gymnasium_vector_env`)."""
        self.build = build
        self.seed = int(seed) + SEED_OFFSET
        self.env = None
        self.broken = False
        self.collects = 0
        self.timings: deque[float] = deque(maxlen=KEPT)

    def measure(self, between: Callable[[], object] | None = None) -> None:
        """Before a rollout: every EVERY-th time, STEPS timed steps of the copy, each after a call of `between`
        (untimed: the policy's forward pass, so that each timed step meets caches as cold as a rollout's step
        does, which alternates with inference)."""
        self.collects += 1
        if self.broken or (self.collects - 1) % EVERY:
            return
        saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
        try:
            self._measure(between)
        except Exception as exc:   # a user env that cannot be built twice: no reference, the run goes on
            log.warning("env-step cost reference unavailable: building or stepping a copy of the env raised %s: %s",
                        type(exc).__name__, exc)
            self.broken = True
            self.close()
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])

    def _measure(self, between) -> None:
        if self.env is None:
            self.env = self.build()
            self.env.reset(seed=self.seed)
            self.env.action_space.seed(self.seed)
        actions = [self.env.action_space.sample() for _ in range(STEPS)]    # drawn outside the timing
        witnessed = hasattr(self.env, "begin")
        if witnessed:
            self.env.begin(STEPS)
        seconds = 0.0
        for action in actions:
            if between is not None:
                between()
            start = time.thread_time()
            self.env.step(action)
            seconds += time.thread_time() - start
        self.timings.append(seconds / STEPS)
        if witnessed:
            self.env.take()   # the copy's record: only its cost mattered

    def reference(self) -> dict[str, float]:
        """`{"env_step_reference": seconds per vector step}` for the rollout's timings, once one was timed."""
        return {"env_step_reference": min(self.timings)} if self.timings else {}

    def close(self) -> None:
        if self.env is not None:
            env, self.env = self.env, None
            try:
                env.close()
            except Exception:   # closing a copy that failed must not end the run
                pass
