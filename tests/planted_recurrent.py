"""Planted faults in a recurrent policy's state (issue 32), each breaking one of the hidden state's stages, planted
from outside the product code: the actor's carry and resets, the state it stores, and the learner's replay.

They run on the masked-velocity CartPole (the state matters there: episodes are long and every step reads it)
with a small LSTM, so the first sampled updates already replay long sequences.
"""

from __future__ import annotations

import numpy as np
import torch
from planted_bug import PlantedBug

RECURRENT = {"recurrent_size": 16, "num_envs": 8, "rollout_length": 64, "num_minibatches": 4}
MASKED = "rlvitals/CartPoleNoVelocity-v1"


def _before_each_act(mp, change):
    """Run `change(runner)` before each of the runner's policy calls."""
    from rlvitals.actors.runner import EnvRunner

    act = EnvRunner._act

    def _act(self, policy, obs):
        change(self)
        return act(self, policy, obs)

    mp.setattr(EnvRunner, "_act", _act)


def state_never_reset(mp):
    # The carry of one episode runs into the next: the start flags are cleared before every step.
    _before_each_act(mp, lambda runner: runner.starting.fill(False))


def state_reset_on_the_reset_transition(mp):
    # Reset one step early under NEXT_STEP autoreset: on the step that only resets the env, so the step acted on
    # that episode's final observation leaks into the next episode.
    def change(runner):
        runner.starting = runner.prev_done.copy()

    _before_each_act(mp, change)


def stored_state_zeroed(mp):
    # The rollout carries an empty state while the actor acted from its real one.
    from rlvitals.actors.runner import EnvRunner

    fields = EnvRunner._recurrent_fields

    def _recurrent_fields(self, initial, age):
        out = fields(self, initial, age)
        if "initial_state" in out:
            out["initial_state"] = torch.zeros_like(out["initial_state"])
        return out

    mp.setattr(EnvRunner, "_recurrent_fields", _recurrent_fields)


def state_dropped_between_rollouts(mp):
    # Each collection starts from an empty state (and says so consistently): the memory of episodes in progress
    # is lost at every rollout boundary.
    from rlvitals.actors.runner import EnvRunner

    collect = EnvRunner.collect

    def collect_from_empty(self, policy, num_steps):
        if self.state is not None:
            self.state = torch.zeros_like(self.state)
        return collect(self, policy, num_steps)

    mp.setattr(EnvRunner, "collect", collect_from_empty)


def learner_replays_from_the_empty_state(mp):
    from rlvitals.learner.networks import ActorCritic

    replay = ActorCritic.replay
    mp.setattr(ActorCritic, "replay", lambda self, obs, starts, state, final=False:
               replay(self, obs, starts, torch.zeros_like(state), final))


def learner_cuts_sequences_a_step_late(mp):
    import rlvitals.learner.ppo as ppo

    starts_of = ppo.episode_starts

    def late(initial_starts, valid):
        starts = starts_of(initial_starts, valid)
        return torch.cat([starts[:1], starts[:-1]])   # each start read one step after it happened

    mp.setattr(ppo, "episode_starts", late)


def minibatch_steps_out_of_order(mp):
    # The loss's replay reads each env's steps in a shuffled order (the targets at arrival stay right).
    from rlvitals.learner.sequences import Sequences

    outputs = Sequences.outputs

    def shuffled(self, net, cols):
        order = torch.from_numpy(np.random.default_rng(0).permutation(self.obs.shape[0]))
        scrambled = Sequences(obs=self.obs[order], starts=self.starts, state=self.state, valid=self.valid)
        return outputs(scrambled, net, cols)

    mp.setattr(Sequences, "outputs", shuffled)


RECURRENT_BUGS: tuple[PlantedBug, ...] = (
    PlantedBug("recurrent_state_never_reset", "actor", "run", state_never_reset, env=MASKED, overrides=RECURRENT,
               invariant="state_reset_at_episode_starts",
               what="a recurrent actor never resets its state: memory runs across episode boundaries"),
    PlantedBug("recurrent_state_reset_on_the_reset_transition", "actor", "run", state_reset_on_the_reset_transition,
               env=MASKED, overrides=RECURRENT, invariant="state_reset_at_episode_starts",
               what="the state is reset one step early (on NEXT_STEP's reset transition), so a step of the old "
                    "episode leaks into the new one"),
    PlantedBug("recurrent_stored_state_zeroed", "actor", "run", stored_state_zeroed, env=MASKED,
               overrides=RECURRENT, invariant="initial_state_as_stored",
               what="the rollout stores an empty initial state; the actor acted from its real one"),
    PlantedBug("recurrent_state_dropped_between_rollouts", "actor", "run", state_dropped_between_rollouts,
               env=MASKED, overrides=RECURRENT, invariant="initial_state_as_stored",
               what="each rollout starts from an empty state (stored as such): memory lost at rollout boundaries"),
    PlantedBug("recurrent_learner_replays_from_the_empty_state", "learner", "run",
               learner_replays_from_the_empty_state, env=MASKED, overrides=RECURRENT,
               invariant="sequence_replay_recomputed",
               what="the learner replays every sequence from zeros instead of the stored state"),
    PlantedBug("recurrent_learner_cuts_sequences_a_step_late", "learner", "run", learner_cuts_sequences_a_step_late,
               env=MASKED, overrides=RECURRENT, invariant="sequence_replay_recomputed",
               what="the learner resets the state one step after each episode start"),
    PlantedBug("recurrent_minibatch_steps_out_of_order", "learner", "run", minibatch_steps_out_of_order, env=MASKED,
               overrides=RECURRENT, invariant="sequence_replay_recomputed",
               what="the loss's replay reads each env's steps out of order"),
)


def learner_cuts_backpropagation_through_time(mp):
    # Values exact, gradients one step deep: the state is detached between steps, so nothing the reward at the
    # end of an episode says reaches the weights that should have stored its cue. Every invariant holds.
    from rlvitals.learner.recurrent import RecurrentCore

    def replay(self, x, starts, state, final=False):
        outputs = []
        for t in range(x.shape[0]):
            state = self.step(x[t], state.detach(), starts[t])
            outputs.append(state[:, 0])
        return torch.stack(outputs), (state if final else None)

    mp.setattr(RecurrentCore, "replay", replay)


DOCTOR_RECURRENT_BUGS: tuple[PlantedBug, ...] = (
    PlantedBug("recurrent_learner_cuts_backpropagation_through_time", "learner", "doctor",
               learner_cuts_backpropagation_through_time, doctor_rule="RLDoctorMemoryProbeUnsolved",
               what="the learner detaches the state between steps: exact values, no gradient through time"),
)
