"""The invariants of a recurrent policy's state: carried, stored and reset as the episodes say, and replayed by
the learner as the actor ran it (measured by learner/invariants/recurrent_state.py; NaN for feed-forward runs)."""

from __future__ import annotations

from .invariant_model import Invariant

REFERENCE = ("On sampled updates (each of the first 16, then every 16th) of batches the learner's current weights "
             "acted on (staleness 0), a float64 LSTM written apart from the product (the gate equations one step at "
             "a time) replays each env's stored sequence from the state the actor stored, zeroing it where the "
             "rollout's validity flags say an episode starts (the step after a reset transition; step 0 as the actor "
             "recorded). ")
TOLERANCE = ("Statistic: max |product - reference| / max(|reference|, 1) over the distribution parameters; the "
             "product's float32 LSTM agrees with the reference to about 1e-6 over a 128-step rollout, so 1e-3 has "
             "no false alarm.")

RECURRENT_INVARIANTS: tuple[Invariant, ...] = (
    Invariant(
        "initial_state_as_stored", "state", "actor", 1e-3, 2,
        "The state a recurrent actor stored with its rollout is not the one it acted from, or not the one it had",
        "The initial state travelling with the rollout (which the learner replays from) is not the state the "
        "actor's policy ran from at the rollout's first steps, or not the state its previous rollout ended with, "
        "or it is stamped with another network age than the weights that computed it: the state was dropped, "
        "reset, copied or stamped wrongly between rollouts.",
        REFERENCE + "Two comparisons: the behaviour parameters of each env's steps before its first episode start "
        "in the rollout against the reference's; and the stored state against the reference's final state of the "
        "same runner's previous rollout (its sequence number one less), whose weights' age the state's stamp must "
        "be (a wrong stamp counts 1). " + TOLERANCE),
    Invariant(
        "state_reset_at_episode_starts", "state", "actor", 1e-3, 2,
        "A recurrent actor does not reset its state exactly at episode starts",
        "From each env's first episode start in the rollout on, the actor's behaviour parameters differ from a "
        "replay that zeroes the state at every episode start and nowhere else: the actor carries memory across "
        "an episode boundary, resets at the wrong step (before or after the reset transition of NEXT_STEP "
        "autoreset), or resets where no episode started.",
        REFERENCE + "The behaviour parameters of each env's steps from its first episode start on against the "
        "reference's. " + TOLERANCE),
    Invariant(
        "sequence_replay_recomputed", "dataflow", "learner", 1e-3, 2,
        "The learner's replay of the recurrent state is not the actor's",
        "The distribution parameters the learner computes for a batch (its targets at arrival and its first "
        "minibatch's loss) differ from a replay of the same stored sequences: the learner starts from zeros or "
        "another step's state instead of the stored one, cuts the sequences at other steps than the episode "
        "starts, or shuffles steps across time inside a minibatch.",
        REFERENCE + "The learner's parameters at arrival (every valid step) and on its first minibatch, before any "
        "optimizer step, against the reference's at the same samples. " + TOLERANCE),
)
