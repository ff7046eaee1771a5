"""Planted faults in what a phase costs and what a process keeps: work hidden inside one phase (the actor's env
step, the learner's minibatch step), and an actor process that keeps what it made. Planted from outside the
product code; each must be named on the component whose phase or process it is (issue 31).
"""

from __future__ import annotations

import torch
from planted_bug import PlantedBug

PENDULUM = "Pendulum-v1"
RAY = {"mode": "ray", "num_actors": 2, "torch_threads": 1}


# ---------------------------------------------------------------- work hidden in one phase


def _bookkeeping_around_the_env_step(mp, record):
    """`record(out, actions, row)` for every env after every env step, in a wrapper around the env the project
    builds: inside the env-step phase, right results, the run just slower."""
    from rlvitals.actors import envs

    original = envs.make_vector_env

    def make_vector_env(*args, **kwargs):
        env = original(*args, **kwargs)
        step = env.step

        def step_with_bookkeeping(actions):
            out = step(actions)
            for row in range(len(actions)):
                record(out, actions, row)
            return out

        env.step = step_with_bookkeeping
        return env

    mp.setattr(envs, "make_vector_env", make_vector_env)
    from rlvitals.actors import runner

    mp.setattr(runner, "make_vector_env", make_vector_env)


def actor_bookkeeps_every_env_in_the_step(mp):
    """O(batch) Python work per env step: a per-env record rebuilt and deep-copied, then thrown away."""
    import copy

    _bookkeeping_around_the_env_step(mp, lambda out, actions, row: copy.deepcopy(
        {"obs": out[0][row].tolist(), "action": actions[row].tolist(), "row": row}))


def actor_copies_the_batch_for_every_env(mp):
    """O(batch^2) work per env step: each env's record holds a deep copy of the whole batch's observations and
    actions (obs where obs[row] was meant), thrown away."""
    import copy

    _bookkeeping_around_the_env_step(mp, lambda out, actions, row: copy.deepcopy(
        {"obs": out[0].tolist(), "action": actions.tolist(), "row": row}))


def learner_recomputes_the_minibatch_forward(mp):
    """Every minibatch's forward pass repeated sixteen times more (a debugging loop left in): the same loss and
    gradient, several times the minibatch step's cost (eight no-grad passes read near the limit, 4, and were
    named only by update 14 on some runs: a fault at the threshold tests the noise, not the check)."""
    from rlvitals.learner.ppo import PPOLearner

    original = PPOLearner._forward_backward

    def _forward_backward(self, b, mb, *args, **kwargs):
        with torch.no_grad():
            for _ in range(16):
                self.net(b.mb_obs[mb])
        return original(self, b, mb, *args, **kwargs)

    mp.setattr(PPOLearner, "_forward_backward", _forward_backward)


# ---------------------------------------------------------------- what an actor process keeps


ROLLOUTS_MADE: list = []


def actor_keeps_every_rollout(mp):
    """Every rollout the env runner made appended to a list in the actor's process that is never cleared."""
    from rlvitals.actors.runner import EnvRunner

    ROLLOUTS_MADE.clear()
    original = EnvRunner.collect

    def collect(self, policy, num_steps):
        rollout = original(self, policy, num_steps)
        ROLLOUTS_MADE.append(rollout)
        return rollout

    mp.setattr(EnvRunner, "collect", collect)


COST_BUGS: tuple[PlantedBug, ...] = (
    PlantedBug("actor_bookkeeps_every_env_in_the_step", "actor", "run", actor_bookkeeps_every_env_in_the_step,
               what="a per-env Python bookkeeping loop inside the env-step phase: right data, hidden work"),
    PlantedBug("actor_copies_the_batch_for_every_env_pendulum", "actor", "run", actor_copies_the_batch_for_every_env,
               env=PENDULUM, what="each env's record in the env-step phase deep-copies the whole batch (O(batch^2))"),
    PlantedBug("ray_actor_bookkeeps_every_env_in_the_step", "actor", "run", actor_bookkeeps_every_env_in_the_step,
               overrides=RAY, mode="ray", in_actors=True,
               what="Ray actors: a per-env Python bookkeeping loop inside the env-step phase"),
    PlantedBug("learner_recomputes_the_minibatch_forward", "learner", "run", learner_recomputes_the_minibatch_forward,
               what="every minibatch's forward pass run sixteen times more: the same step, hidden work"),
    PlantedBug("ray_actor_keeps_every_rollout", "memory", "run", actor_keeps_every_rollout, overrides=RAY,
               mode="ray", in_actors=True, budget_scale=10.0,
               what="Ray actors keep every rollout they made in a list nothing clears"),
)
